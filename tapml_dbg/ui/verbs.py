"""The verbs the command line and the REPL share: bisect, run, migrate and dump, declared once.

Each `Verb` holds what both front ends say of it: its options (`--no-sweep`, `--by`, ...), declared
here only; `ui/cli.py` adds them to its subcommand's parser (`add_options`) and the REPL's command
table (`ui/repl/commands.py`) takes its usage line, its completion and the parsing of its words
(`parse`) from the same declaration. Arguments only one side has stay on that side: the CLI's
trace, target and `--json` (a REPL session has them already), the REPL's positional words (`run
[all|none|OPS|LAYERS]`, `dump OP DIR`), whose CLI spellings are options (`--offload`, `--op`, `-o`).
The help texts of both sides live here too, side by side, so that they are changed together.
"""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass

from tapml_dbg.ui.repl.parsing import ArgError

HELP_WIDTH = 95  # a REPL help body written from one paragraph is wrapped at this width


@dataclass(frozen=True)
class Option:
    """`--flag` as both front ends take it: a switch (no `choices`), or one word of `choices`."""

    flag: str
    help: str
    choices: tuple[str, ...] = ()
    default: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def words(self) -> str:
        """`--by layer|op`, `--no-sweep`: how usage lines and error hints write it."""
        return f"{self.flag} {'|'.join(self.choices)}" if self.choices else self.flag

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.choices:
            parser.add_argument(self.flag, choices=list(self.choices), default=self.default, help=self.help)
        else:
            parser.add_argument(self.flag, action="store_true", help=self.help)


@dataclass(frozen=True)
class Verb:
    """A command of both front ends: its options, its CLI summary and description, its REPL help."""

    name: str
    summary: str  # its line in `tapml-dbg --help`
    description: str  # what `tapml-dbg NAME --help` says after the summary
    repl_help: str  # the REPL's `help NAME`: a summary line, then the body
    options: tuple[Option, ...] = ()
    operands: str = ""  # the REPL's positional words after the options, as its usage line writes them
    operand_completion: tuple = ()  # what the REPL completes for each positional word (commands.Command.args)

    @property
    def usage(self) -> str:
        """The REPL's usage line: `migrate [--by layer|op] [--one-at-a-time]`."""
        return " ".join([self.name, *(f"[{option.words}]" for option in self.options),
                         *([self.operands] if self.operands else [])])

    @property
    def completion(self):
        """The REPL's completion: the positional words', or for a verb with options a function of the
        words before: the choices after an option that takes one, else the options not given yet."""
        if not self.options:
            return self.operand_completion
        return self._complete_option

    def _complete_option(self, previous: list[str]) -> tuple:
        option = self._option(previous[-1]) if previous else None
        if option is not None and option.choices:
            return option.choices
        return tuple(o.flag for o in self.options if o.flag not in previous)

    def _option(self, word: str) -> Option | None:
        return next((option for option in self.options if option.flag == word), None)

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """The verb's options on its CLI subcommand."""
        for option in self.options:
            option.add_to(parser)

    def parse(self, words: list[str]) -> dict[str, object]:
        """The REPL's words after the verb, by the same options: {dest: value} (a switch not given is
        False, an option not given its default). A word no option takes raises `ArgError`."""
        values: dict[str, object] = {o.dest: o.default if o.choices else False for o in self.options}
        rest = list(words)
        while rest:
            word = rest.pop(0)
            option = self._option(word)
            if option is None or (option.choices and not rest):
                hint = " and/or ".join(o.words for o in self.options)
                raise ArgError(f"unknown option {word!r}: give {hint}")
            values[option.dest] = rest.pop(0) if option.choices else True
        return values


def _wrapped(summary: str, body: str) -> str:
    return summary + "\n" + textwrap.fill(body, HELP_WIDTH)


BISECT_DESCRIPTION = (
    "Chains every op on the target, each compiled alone and fed the target's own values before it, and "
    "screens every value as it is computed: the first wrong op, isolated or propagated, is the candidate. "
    "When the chain finds nothing, prefixes of the model compiled as one unit are searched for a fusion bug. "
    "Then the isolated verdicts of the ops below the candidate are swept (--no-sweep skips it), so a fault "
    "that washes out downstream is still found; an op whose import changes its dtype or shape counts too.")

BISECT = Verb(
    "bisect", "find the first divergent op", BISECT_DESCRIPTION,
    _wrapped("Find the first divergent op.", BISECT_DESCRIPTION + " Ctrl-C cancels."),
    options=(Option("--no-sweep", "skip the isolated sweep that catches faults which wash out downstream"),))

RUN = Verb(
    "run", "run the model once mixed: the offload set on the target, the rest on the source",
    "Ops off the target re-execute on torch CPU in the recorded dtype, fed the values before "
    "them (the target's where their producer is offloaded); prints the model's outputs against "
    "the recording, top-1 agreement of the last dimension and the ops failing in that run "
    "(docs/migrate.md).",
    "Run the whole model once mixed: the offload set on the target, the rest on the source.\n"
    "Ops off the target re-execute on torch CPU fed the values before them (the target's where\n"
    "their producer is offloaded); prints the model's outputs against the recording and the ops\n"
    "failing in that run. Without argument: the offload set (`boundary`, `offload`).",
    operands="[all|none|OPS|LAYERS]", operand_completion=(("all", "none", "<layer>"),))

MIGRATE = Verb(
    "migrate", "offload the model step by step and find where its output breaks",
    "TapML's gradual migration: the offloaded prefix grows one top-level block (or op) per "
    "step, one mixed run each; a table of the output's error per step, the first failing "
    "step and the op inside it that breaks the output (docs/migrate.md).",
    "TapML's gradual offload: one mixed run per step, the step that breaks the output, its culprit.\n"
    "The offloaded prefix grows one top-level block (or op) at a time; --one-at-a-time puts one\n"
    "block alone on the target to rank blocks by their effect on the output (docs/migrate.md).",
    options=(Option("--by", "what a step adds: a top-level block (default) or one op", choices=("layer", "op"),
                    default="layer"),
             Option("--one-at-a-time", "only one block (or op) on the target per step, the rest on the source: "
                                       "ranks them by their effect on the output")))

DUMP = Verb(
    "dump", "write one op as a standalone repro",
    "A folder with the op's Relax module, its recorded inputs and outputs, and a repro.py "
    "that needs only tvm and numpy.",
    "Write an op as a standalone repro into DIR.\n"
    "The repro needs only tvm and numpy. OP may be a range A:B: ops A..B-1 as one unit; an op\n"
    "that fails only compiled with its producers (fused) is written as that unit.",
    operands="OP DIR", operand_completion=(("<op>",), ("<path>",)))
