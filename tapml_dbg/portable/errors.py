"""The one exception of the portable runtime, and the one-line wording of any exception.

`PortableError` means "this cannot run as asked" (a missing file, bad meta, a bad target string,
an unreachable RPC server, no device, no device code): the repro says so and exits 2, the engine
maps it to its own `TapmlError` subclasses. It is not a verdict on the op.
"""

from __future__ import annotations

MESSAGE_LIMIT = 500  # characters of one exception's message kept in a report line


class PortableError(Exception):
    """The portable runtime cannot do what was asked; the message says what to fix."""


def one_line(exc: BaseException) -> str:
    """`Type: last non-empty line of the message`, cut to MESSAGE_LIMIT (TVM errors end with the cause)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:MESSAGE_LIMIT]
