"""The one exception of the portable runtime, and the one-line wording of any exception.

`PortableError` means "this cannot run as asked" (a missing file, bad meta, a bad target string,
an unreachable RPC server, no device, no device code): the repro says so and exits 2, the engine
maps it to its own `TapmlError` subclasses. It is not a verdict on the op.
"""

from __future__ import annotations

MESSAGE_LIMIT = 500  # characters of one exception's message kept in a report line


class PortableError(Exception):
    """The portable runtime cannot do what was asked; the message says what to fix."""


class TransformFailed(PortableError):
    """The user's transform (`--transform FILE.py:FUNC`) raised: a bug of the pass, not a verdict on
    the op, so never "the op does not compile". The message names the pass's own line."""


def one_line(exc: BaseException) -> str:
    """`Type: last non-empty line of the message`, cut to MESSAGE_LIMIT (TVM errors end with the cause).
    Without a message (a bare `assert` inside TVM's schedule rules), where it was raised instead:
    the statement and its file:line, so a report says more than `AssertionError:`."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else _raised_at(exc)}"[:MESSAGE_LIMIT]


def _raised_at(exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if not frames:
        return ""
    frame = frames[-1]
    parts = frame.filename.replace("\\", "/").split("/")
    short = "/".join(parts[parts.index("site-packages") + 1:] if "site-packages" in parts else parts[-3:])
    statement = f"`{frame.line.strip()}` " if frame.line else ""
    return f"{statement}at {short}:{frame.lineno} (no message)"


def raised_in(exc: BaseException, filename: str) -> str:
    """`FILE:LINE in FUNC (`statement`)`: the innermost frame of `exc`'s traceback in `filename` (the
    user's file whose code called what raised), else the innermost frame; "" without a traceback."""
    import os
    import traceback

    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    wanted = os.path.abspath(filename)
    own = [frame for frame in frames if os.path.abspath(frame.filename) == wanted]
    if not (own or frames):
        return ""
    frame = (own or frames)[-1]
    statement = f" (`{frame.line.strip()}`)" if frame.line else ""
    return f"{shown_path(frame.filename)}:{frame.lineno} in {frame.name}{statement}"


def shown_path(path: str) -> str:
    """`path` relative to the current directory when under it (as a user spells it), else as it is."""
    import os

    full, here = os.path.abspath(path), os.getcwd()
    return os.path.relpath(full, here) if full.startswith(here + os.sep) else path
