"""The REPL loop: parse a line, dispatch through the command table, render, never die.

Errors are caught by category (pgcli's pattern): an unknown command names the closest one; bad
arguments print the usage line; a `TapmlError` prints one line; any other exception is an
internal error, printed as one line (the traceback only with TAPML_DEBUG=1). Ctrl-C during a
command cancels it ("cancelled") and the session goes on; at the prompt it clears the line.

`run_replay(args)` is what `tapml-dbg replay` calls: an interactive prompt on a terminal, or the
commands of `-c "cmd; cmd"`, `--script FILE` (or a piped stdin) run one by one, echoed after
the prompt so the output reads like a session; the exit status is 1 if any command failed.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from prompt_toolkit.history import History
from rich.console import Console
from rich.markup import escape

from tapml_dbg.engine.session import open_judged
from tapml_dbg.engine.stops import Debugger, RunResult
from tapml_dbg import settings
from tapml_dbg.errors import TapmlError, UsageError
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.ui.repl.commands import Context, UnknownCommand, lookup
from tapml_dbg.ui.repl.parsing import ArgError, split_commands, tokenize
from tapml_dbg.ui.console import error_line, make_console, progress
from tapml_dbg.ui.render import print_note, render
from tapml_dbg.ui.repl.completion import make_completer
from tapml_dbg.ui.repl.results import Quit

EXIT_FAILED = 1  # a command failed in -c / --script mode
EXIT_INTERRUPTED = 130  # Ctrl-C during -c / --script mode


@dataclass
class Outcome:
    ok: bool = True
    quit: bool = False
    cancelled: bool = False


class Repl:
    """One REPL over one engine session. Tests drive `execute` or `interact` directly."""

    def __init__(self, session, out: Console | None = None, err: Console | None = None,
                 launch: dict | None = None, show_progress: bool | None = None):
        self.session = session
        self.debugger = Debugger(session)
        self.out = out or make_console(sys.stdout)
        self.err = err or make_console(sys.stderr)
        self.show_progress = self.err.is_terminal if show_progress is None else show_progress
        self.ctx = Context(session, self.debugger, self._progress, dict(launch or {}))

    # ---------------------------------------------------------------- prompt
    def prompt_parts(self) -> list[tuple[str, str]]:
        session = self.session
        target = session.target + (f"@{session.spec.rpc}" if session.spec.rpc else "")
        parts = [("class:target", f"({target}) ")]
        position = self.debugger.position
        if position < len(session.ops):
            op = session.ops[position]
            parts += [("class:index", f"#{op.index} "), ("class:op", op.name),
                      ("class:layer", f" [{op.layer or '<top>'}]")]
        else:
            parts += [("class:index", f"#{position} "), ("class:op", "<end>")]
        parts.append(("", "> "))
        return parts

    def prompt_text(self) -> str:
        return "".join(text for _style, text in self.prompt_parts())

    # ---------------------------------------------------------------- one line
    def execute(self, line: str) -> Outcome:
        line = line.strip()
        if not line or line.startswith("#"):
            return Outcome()
        command = None
        try:
            words = tokenize(line)
            if not words:
                return Outcome()
            command = lookup(words[0])
            edited = self.session.notice_transform_edit()  # a pass edited between two commands (the
            if edited:  # debugger forgets the verdicts it has seen: `Session.observe`)
                print_note(edited, self.out)
            result = command.handler(self.ctx, words[1:])
            render(result, self.out)
        except UnknownCommand as exc:
            self._error(str(exc))
            return Outcome(ok=False)
        except ArgError as exc:
            self._error(f"{command.name}: {exc}" if command else str(exc))
            if command is not None:
                self.err.print(f"usage: {escape(command.usage)}")
            return Outcome(ok=False)
        except TapmlError as exc:
            self._error(str(exc))
            return Outcome(ok=False)
        except KeyboardInterrupt:
            self.out.print("[yellow]cancelled[/]")
            return Outcome(ok=False, cancelled=True)
        except Exception as exc:  # an internal bug: report it, keep the session
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.err.print(f"[bold red]internal error:[/] {escape(type(exc).__name__)}: {escape(first)}"
                           + ("" if settings.value(settings.DEBUG) else f" (set {settings.DEBUG}=1 for the traceback)"),
                           soft_wrap=True)
            if settings.value(settings.DEBUG):
                self.err.print(escape(traceback.format_exc()), soft_wrap=True)
            return Outcome(ok=False)
        if isinstance(result, Quit):
            return Outcome(quit=True)
        if isinstance(result, RunResult) and result.cancelled:
            return Outcome(ok=False, cancelled=True)
        return Outcome()

    def _error(self, message: str) -> None:
        error_line(message, self.err)

    def _progress(self, label: str):
        """The one progress bar, on the error console, shown when `show_progress`."""
        return progress(label, self.err, show=self.show_progress)

    # ---------------------------------------------------------------- loops
    def interact(self, input=None, output=None, history=None) -> int:
        """The prompt loop (prompt-toolkit); `input`/`output` let tests use a pipe input."""
        from prompt_toolkit import PromptSession
        from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
        from prompt_toolkit.styles import Style

        style = Style.from_dict({"target": "ansimagenta", "index": "ansicyan", "op": "bold", "layer": "ansigreen"})
        kept = SucceededOnly(history if history is not None else open_history())
        prompt = PromptSession(history=kept, completer=make_completer(self.session, self.debugger),
                               complete_while_typing=False, auto_suggest=AutoSuggestFromHistory(), style=style,
                               input=input, output=output)
        while True:
            try:
                line = prompt.prompt(self.prompt_parts)
            except KeyboardInterrupt:
                kept.drop()
                continue  # Ctrl-C at the prompt clears the line
            except EOFError:
                self.out.print("quit")
                return 0
            outcome = self.execute(line)
            kept.keep() if outcome.ok else kept.drop()
            if outcome.quit:
                return 0

    def run_commands(self, commands: list[str], echo: bool = True) -> int:
        """Run commands non-interactively; 1 if any failed, 130 when cancelled with Ctrl-C."""
        failed = False
        for line in commands:
            if echo:
                self.out.print(self.prompt_text() + line, markup=False, highlight=False, soft_wrap=True)
            outcome = self.execute(line)
            if outcome.cancelled:
                return EXIT_INTERRUPTED
            failed = failed or not outcome.ok
            if outcome.quit:
                break
        return EXIT_FAILED if failed else 0

    def banner(self) -> str:
        session = self.session
        return (f"tapml-dbg replay of {session.reader.path}: {len(session.ops)} ops, {len(session.op_table.layers())} "
                f"layers, on {session.target}. `help` lists commands, Tab completes, Ctrl-D leaves.")


class SucceededOnly(History):
    """A history that keeps a line only once its command succeeded.

    prompt-toolkit appends every accepted line; a typo or a failed command would then come back
    from Up and as a grey auto-suggestion. The accepted line waits here until `keep` (the
    command ran) or `drop` (it failed); the wrapped history (a file) only ever sees kept lines.
    """

    def __init__(self, backend):
        super().__init__()
        self.backend = backend
        self.pending: str | None = None

    def load_history_strings(self):
        return self.backend.load_history_strings()

    def store_string(self, string: str) -> None:
        self.backend.store_string(string)

    def append_string(self, string: str) -> None:
        self.pending = string

    def keep(self) -> None:
        if self.pending is not None:
            super().append_string(self.pending)
        self.pending = None

    def drop(self) -> None:
        self.pending = None


def open_history():
    """File history at $TAPML_HISTORY or ~/.cache/tapml-dbg/history; in memory if unwritable."""
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    path = settings.value(settings.HISTORY)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        with open(path, "a"):
            pass
    except OSError:
        return InMemoryHistory()
    return FileHistory(str(path))


def _read_commands(args) -> list[str] | None:
    """Commands of -c and --script (in that order); a piped stdin counts as a script; None: interactive."""
    commands: list[str] = []
    given = False
    if getattr(args, "commands", None) is not None:
        commands += split_commands(args.commands)
        given = True
    if getattr(args, "script", None):
        try:
            text = Path(args.script).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the script {args.script}: {exc}") from None
        commands += split_commands(text)
        given = True
    if not given and not sys.stdin.isatty():
        commands += split_commands(sys.stdin.read())
        given = True
    return commands if given else None


def run_replay(args) -> int:
    """`tapml-dbg replay TRACE [...]`: open the session, then a prompt or the given commands."""
    commands = _read_commands(args)
    spec = TargetSpec.from_args(args)  # every target option, --parallel included
    out, err = make_console(sys.stdout), make_console(sys.stderr)
    status = err.status("opening the trace…") if err.is_terminal else contextlib.nullcontext()
    with status:
        session = open_judged(args.trace, spec, reference=TargetSpec.reference_from_args(args), start_workers=True)
    launch = {"trace": args.trace}  # the path as typed, for the commands `dump` suggests
    with session:
        repl = Repl(session, out, err, launch=launch)
        if commands is None:
            out.print(escape(repl.banner()))
            return repl.interact()
        return repl.run_commands(commands)
