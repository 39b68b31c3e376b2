"""The one table of commands (tapml_dbg.api.COMMANDS): a command declared there, with its renderer, is a
`tapml-dbg` subcommand, a REPL command and a `tapml_dbg.NAME` function, with no edit to ui/.

The commands are declared in a fresh interpreter (the REPL's table is made when its module is imported),
on functions that need no trace, so that the test runs nothing heavy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DECLARE = '''
import json, sys, types
from dataclasses import dataclass
from tapml_dbg import api


@dataclass
class Echoed:
    words: list

    def to_json(self):
        return {"words": self.words}


@api.command(api.Command(
    "echo", "say words back", "Each WORD on one line, --upper in capitals.",
    (api.Arg(("words",), "what to say", metavar="WORD", param="words"),
     api.Arg(("--upper",), "in capitals", switch=True, param="upper"), *api.JSON),
    progress="echoing"))
def echo(words, upper=False, progress=api._noop):
    progress(1, 1)
    return Echoed([words.upper() if upper else words])


class More:
    @api.command(api.Command(
        "shout", "say the target's name back", "The target, --times N times.",
        (*api.TRACE, api.Arg(("--times",), "how often", choices=("1", "2"), default="1", param="times", repl=True),
         *api.TARGET),
        progress="shouting", repl_help="Say the target's name back.\\nAs often as --times says."))
    def shout(self, times="1", progress=api._noop):
        return Echoed([self.session.target] * int(times))


from tapml_dbg.ui.render import render


@render.register
def _(result: Echoed, console):
    for word in result.words:
        console.print(word)
'''


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DECLARE + script], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={**__import__("os").environ, "TAPML_SERVER": "0"})


def test_a_command_in_the_table_is_a_cli_subcommand_with_help_json_and_rendering():
    done = _run('''
from tapml_dbg.ui import cli
parser = cli.build_parser()
print(parser.format_help())
code = cli.main(["echo", "hi", "--upper"])
code_json = cli.main(["echo", "there", "--json"])
print("codes", code, code_json)
''')
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "echo      say words back" in out  # listed in `tapml-dbg --help`, before serve
    assert out.index("    echo ") < out.index("    serve ")
    assert "\nHI\n" in out and '{"words": ["there"]}' in out and "codes 0 0" in out


def test_a_command_in_the_table_is_a_repl_command_on_the_session():
    done = _run('''
from types import SimpleNamespace
from tapml_dbg.ui.repl import commands as C
from tapml_dbg.ui.repl.parsing import ArgError
names = [command.name for command in C.COMMANDS]
shout = C.lookup("shout")
print("place", names.index("shout") == names.index("reset") - 1, "echo" in names)
print("usage", shout.usage)
print("help", shout.summary)
print("completion", shout.completion_for([]), shout.completion_for(["--times"]))
ctx = C.Context(session=SimpleNamespace(target="llvm"), debugger=None)
print("result", shout.handler(ctx, ["--times", "2"]).words)
try:
    shout.handler(ctx, ["loud"])
except ArgError as exc:
    print("error", exc)
''')
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["place"] == "True False"  # before `reset` and `quit`; a command without repl_help is the CLI's only
    assert lines["usage"] == "shout [--times 1|2]"
    assert lines["help"] == "Say the target's name back."
    assert lines["completion"] == "('--times',) ('1', '2')"
    assert lines["result"] == "['llvm', 'llvm']"
    assert lines["error"] == "unknown option 'loud': give --times 1|2"


def test_a_function_command_is_the_packages_and_a_submodule_is_not_shadowed():
    done = _run('''
import tapml_dbg
print(json.dumps([tapml_dbg.echo("a").words, hasattr(tapml_dbg, "shout"), hasattr(tapml_dbg, "nothing"),
                  "tapml_dbg.engine.session" in sys.modules]))
from tapml_dbg import settings
print(settings.__name__)
''')
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert json.loads(first) == [["a"], False, False, True]  # the API's import brings the engine: asked for
    assert second == "tapml_dbg.settings"


def test_importing_the_package_and_a_submodule_imports_no_engine():
    """A worker imports the package first and must not import the engine: the package's `__getattr__`
    leaves a submodule's name to the import system."""
    done = subprocess.run([sys.executable, "-c", "import sys, tapml_dbg\nfrom tapml_dbg import settings, errors\n"
                           "from tapml_dbg.trace import schema\nprint('tapml_dbg.api' in sys.modules, "
                           "any(m.startswith('tapml_dbg.engine') for m in sys.modules))"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_every_subcommand_and_its_every_argument_is_declared_in_the_table():
    """One way to declare a command line: every subcommand of `tapml-dbg --help` is an entry of the table,
    and its parser holds exactly the entry's arguments, in their order (none added by hand in ui/cli.py);
    `replay` and `serve`, which are the command line's own, are entries without an API function."""
    import argparse

    from tapml_dbg.api import COMMANDS, find_command
    from tapml_dbg.ui import cli

    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(subcommands) == sorted(entry.name for entry in COMMANDS)
    for name, subparser in subcommands.items():
        made = [(tuple(action.option_strings) or (action.dest,), action.dest) for action in subparser._actions
                if not isinstance(action, argparse._HelpAction)]
        assert made == [(arg.flags, arg.dest) for arg in find_command(name).arguments], name
    assert sorted(entry.name for entry in COMMANDS if entry.function is None) == ["replay", "serve"]
