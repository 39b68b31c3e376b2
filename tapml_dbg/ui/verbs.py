"""The table of commands (`tapml_dbg.api.COMMANDS`) as both front ends take it.

An entry declares a command once, beside the API method it calls: its arguments in argparse's words,
its CLI summary and description, its REPL help. Here the CLI's subcommand parser (`add_subcommand`)
and the REPL's usage line, completion and parsing of its words (`usage`, `completion`, `parse`) are
made from it. Arguments only one side has stay on that side: the CLI's trace, target and `--json` (a
REPL session has them already), the REPL's positional words (`run [all|none|OPS|LAYERS]`, `dump OP
DIR`), whose CLI spellings are options (`--offload`, `--op`, `-o`).
"""

from __future__ import annotations

import argparse

from tapml_dbg.api import Arg, Command
from tapml_dbg.ui.repl.parsing import ArgError


def add_subcommand(commands, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand whose `--help` opens with what it does (`summary` is its line in `tapml-dbg --help`)."""
    return commands.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. {description}")


def add_command(commands, entry: Command) -> argparse.ArgumentParser:
    """The CLI subcommand of a table entry: its help and its arguments, in their order."""
    parser = add_subcommand(commands, entry.name, entry.summary, entry.description)
    add_arguments(parser, entry.arguments)
    return parser


def add_arguments(parser: argparse.ArgumentParser, arguments: tuple[Arg, ...]) -> None:
    """Each argument on `parser`; those of one `group` mutually exclusive."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for arg in arguments:
        where = parser
        if arg.group:
            if arg.group not in groups:
                groups[arg.group] = parser.add_mutually_exclusive_group(required=arg.required)
            where = groups[arg.group]
        where.add_argument(*arg.flags, **_argparse_options(arg))


def _argparse_options(arg: Arg) -> dict:
    options = {"dest": arg.store} if arg.store else {}
    if arg.switch:
        return {**options, "action": "store_true", "help": arg.help}
    options["help"] = arg.help
    for name in ("metavar", "type", "default"):
        if getattr(arg, name) is not None:
            options[name] = getattr(arg, name)
    if arg.choices:
        options["choices"] = list(arg.choices)
    if arg.required and not arg.positional and not arg.group:
        options["required"] = True
    return options


def usage(entry: Command) -> str:
    """The REPL's usage line: `migrate [--by layer|op] [--one-at-a-time]`."""
    return " ".join([entry.name, *(f"[{option.words}]" for option in entry.repl_options),
                     *([entry.operands] if entry.operands else [])])


def completion(entry: Command):
    """The REPL's completion: the positional words', or for a command with options a function of the
    words before: the choices after an option that takes one, else the options not given yet."""
    options = entry.repl_options
    if not options:
        return entry.operand_completion

    def complete(previous: list[str]) -> tuple:
        option = _option(options, previous[-1]) if previous else None
        if option is not None and option.choices:
            return option.choices
        return tuple(o.flag for o in options if o.flag not in previous)

    return complete


def _option(options: tuple[Arg, ...], word: str) -> Arg | None:
    return next((option for option in options if option.flag == word), None)


def parse(entry: Command, words: list[str]) -> dict[str, object]:
    """The REPL's words after the command, by its options: {dest: value} (a switch not given is False,
    an option not given its default). A word no option takes raises `ArgError`."""
    options = entry.repl_options
    values: dict[str, object] = {o.dest: o.default if o.choices else False for o in options}
    rest = list(words)
    while rest:
        word = rest.pop(0)
        option = _option(options, word)
        if option is None or (option.choices and not rest):
            hint = " and/or ".join(o.words for o in options)
            raise ArgError(f"unknown option {word!r}: give {hint}")
        values[option.dest] = rest.pop(0) if option.choices else True
    return values
