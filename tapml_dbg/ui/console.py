"""Console plumbing shared by the CLI and the REPL: consoles, the progress bar, the `error:` line.

Rendering results is `render.py`'s; nothing here knows a result type.
"""

from __future__ import annotations

import contextlib
import re
import sys

from rich.console import Console
from rich.markup import escape

TRANSCRIPT_WIDTH = 100  # columns of output when the stream is not a terminal (pipes, files, tests)
PROGRESS_HINT = "(Ctrl-C cancels)"  # shown after the bar's note
_TRAILING_SPACES = re.compile(r"[ \t]+\n")


def make_console(stream=None) -> Console:
    """A console for `stream`: the terminal's width and colors, or fixed width and no colors."""
    stream = stream or sys.stdout
    if hasattr(stream, "isatty") and stream.isatty():
        return Console(file=stream, highlight=False, soft_wrap=True)
    return Console(file=_TrimmedLines(stream), highlight=False, width=TRANSCRIPT_WIDTH, color_system=None,
                   soft_wrap=True, force_terminal=False, force_interactive=False, emoji=False)


class _TrimmedLines:
    """A text stream that drops the trailing spaces rich pads table rows with (clean transcripts)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(_TRAILING_SPACES.sub("\n", text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def error_line(message: str, console: Console) -> None:
    """A `TapmlError` as the user sees it: one red `error:` line (the message is escaped)."""
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def _no_progress(*_args, **_kwargs) -> None:
    return None


@contextlib.contextmanager
def progress(label: str, console: Console, show: bool | None = None):
    """Yields `callback(done, total=None, note="")`: a transient bar when `show` (default: on a terminal).

    The engine reports progress through such a callback and never prints; off a terminal the
    callback does nothing, so pipes and transcripts stay clean.
    """
    if not (console.is_terminal if show is None else show):
        yield _no_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    # the label travels as a task field, never inside a column's format string: a target such as
    # {"kind":"llvm","mcpu":"haswell"} holds braces that str.format would read as fields
    with Progress(SpinnerColumn(), TextColumn("{task.fields[label]}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn(f"{{task.description}}  [dim]{PROGRESS_HINT}[/]"),
                  console=console, transient=True) as bar:
        task = bar.add_task("", total=None, label=escape(label))

        def update(done, total=None, note: str = "") -> None:
            bar.update(task, completed=done, total=total, description=escape(str(note)))

        yield update
