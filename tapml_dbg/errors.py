"""One error hierarchy: a `TapmlError` is the user's to fix and its message says how.

Internal bugs are deliberately *not* `TapmlError`s, so they surface with a traceback.
"""


class TapmlError(Exception):
    """A user-facing failure; the CLI prints it as one line and exits 1."""

    detail: str = ""  # the long text behind the one line (a library's full message): shown with TAPML_DEBUG=1


class TraceError(TapmlError):
    """The trace file is missing, corrupt, incomplete where it matters, or too new."""


class ModelError(TapmlError):
    """The model file, its build function, export or import failed."""


class TargetError(TapmlError):
    """The target cannot be used: bad target string, no device, lost RPC connection."""


class TransformError(TapmlError):
    """The user's `--transform FILE.py:FUNC` raised while the tool applied it (the pass's own line is in
    the message): a bug of the pass, never reported as the op failing to compile."""


class UsageError(TapmlError):
    """A command or argument is wrong; the message gives the usage."""
