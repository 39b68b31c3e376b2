"""The README and docs/ as a new user meets them: every command parses, the transcripts still run.

Fast checks only (the full run of every command is `benchmarks/docs_check.py`):
- every `tapml-dbg ...` command line in README.md and docs/*.md parses with the real CLI parser
  (a renamed or removed flag fails here);
- every command typed at a REPL prompt in a transcript is a REPL command (or the error the
  transcript shows);
- (every transcript is made again and compared exactly by tests/test_transcripts.py);
- and what a newcomer meets first: a bad `-o`, a build() that raises.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT
from tapml_dbg.ui import cli
from tapml_dbg.ui.repl.commands import UnknownCommand, lookup
from tapml_dbg.ui.repl.parsing import tokenize

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
PROMPT = re.compile(r"^\((?P<target>[^)]+)\) #(?P<position>\S+) (?P<where>.*?)> (?P<command>.*)$")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
SYNOPSIS_MARKS = ("[", "…")  # a usage line, not a command to run


@dataclass
class Shell:
    doc: Path
    line: str
    argv: list[str]  # after `tapml-dbg`
    env: dict


def code_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text())


def shell_commands(path: Path) -> list[Shell]:
    """The `tapml-dbg` commands a reader would type: `$ ` lines, and the lines of blocks holding
    nothing but commands (output that quotes a command is not one)."""
    found = []
    for block in code_blocks(path):
        lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
        typed = [line[2:] for line in lines if line.startswith("$ ")]
        if not typed and all(_is_command(line) or line.lstrip().startswith("#") for line in lines):
            typed = lines
        for line in typed:
            for words in _chain(line):
                env = {}
                while words and ENV_ASSIGNMENT.match(words[0]):
                    key, _, value = words.pop(0).partition("=")
                    env[key] = value
                if words[:1] == ["tapml-dbg"] and not any(mark in w for w in words for mark in SYNOPSIS_MARKS):
                    found.append(Shell(path, shlex.join(words), words[1:], env))
    return found


INLINE = re.compile(r"(?<!`)`(tapml-dbg [^`]+)`(?!`)")  # a command quoted in prose


def inline_commands(path: Path) -> list[Shell]:
    """`tapml-dbg ...` spans in the prose (outside fenced blocks), e.g. `tapml-dbg dump t.h5 --op 9 -o DIR`."""
    prose = re.sub(r"^(`{3,})[^\n]*\n.*?^\1", "", path.read_text(), flags=re.S | re.M)
    found = []
    for span in INLINE.findall(prose):
        for words in _chain(" ".join(span.split())):
            # naming a command or a flag in prose: `tapml-dbg record`, `tapml-dbg COMMAND --help`, `info --verify`
            naming = len(words) < 3 or words[1].isupper() or all(w.startswith("-") or w.isupper() for w in words[2:])
            if words[:1] == ["tapml-dbg"] and not naming and not any(m in w for w in words for m in SYNOPSIS_MARKS):
                found.append(Shell(path, shlex.join(words), words[1:], {}))
    return found


def _chain(line: str) -> list[list[str]]:
    """`a && b; c | d  # note` -> [[a], [b], [c], [d]], quotes respected."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    redirect = False
    for token in lexer:
        if token in (";", "&&", "||", "|", "&"):
            parts.append([])
        elif token in ("<", ">", ">>"):
            redirect = True  # the next word is a file, not an argument
        elif redirect:
            redirect = False
        else:
            parts[-1].append(token)
    return [part for part in parts if part]


def _is_command(line: str) -> bool:
    words = line.split()
    while words and ENV_ASSIGNMENT.match(words[0]):
        words.pop(0)
    return bool(words) and words[0] in ("tapml-dbg", "pip", "python", "cd", "export")


@dataclass
class Typed:
    prompt: str  # the prompt as printed, "(llvm) #0 view [query]> "
    command: str
    output: list[str]  # the lines up to the next prompt


def transcript(block: str) -> list[Typed]:
    """The commands typed at a REPL prompt in a code block, with what followed each."""
    typed: list[Typed] = []
    for line in block.splitlines():
        match = PROMPT.match(line)
        if match:
            command = match.group("command").split("  #")[0].strip()
            typed.append(Typed(line[:match.start("command")], command, []))
        elif typed and not line.startswith("$ "):
            typed[-1].output.append(line)
    return typed


def transcripts(path: Path) -> list[list[Typed]]:
    return [found for block in code_blocks(path) if (found := transcript(block))]


# ------------------------------------------------------------------ what every doc says, parsed
def test_every_documented_command_parses():
    commands = [command for doc in DOCS for command in shell_commands(doc) + inline_commands(doc)]
    assert len(commands) > 30 and any(c.argv[:1] == ["report"] for c in commands)
    parser = cli.build_parser()
    wrong = []
    for command in commands:
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(command.argv)
        except SystemExit as exc:  # `--help` and `--version` exit 0
            if exc.code:
                wrong.append(f"{command.doc.name}: {command.line}")
    assert not wrong, "documented commands the CLI refuses:\n" + "\n".join(wrong)


def test_every_transcript_command_is_a_repl_command():
    checked = 0
    for doc in DOCS:
        for session in transcripts(doc):
            for typed in session:
                words = tokenize(typed.command)
                expect_unknown = any(line.startswith("error: unknown command") for line in typed.output[:1])
                if expect_unknown:
                    with pytest.raises(UnknownCommand):
                        lookup(words[0])
                else:
                    lookup(words[0])
                checked += 1
    assert checked > 20


# ------------------------------------------------------------------ the transcripts: tests/test_transcripts.py
def test_the_readme_shows_the_report_it_describes():
    assert "docs/img/report-fp16_memory_attention.png" in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "img" / "report-fp16_memory_attention.png").stat().st_size > 20_000


# ------------------------------------------------------------------ what a newcomer meets first
MARKER_MODEL = """
import pathlib, torch
def build():
    pathlib.Path({marker!r}).write_text("built")  # build() ran: the export would follow
    return torch.nn.Linear(2, 2), (torch.randn(1, 2),)
"""


@pytest.mark.parametrize("output", ["missing_dir/t.h5", "a_folder"])
def test_a_bad_output_path_fails_in_one_line_before_the_model_is_built(tmp_path, output, monkeypatch, capsys):
    """`-o missing_dir/t.h5` and `-o some_directory` printed a 38-line h5py traceback after the export."""
    marker = tmp_path / "built.txt"
    model = tmp_path / "model.py"
    model.write_text(MARKER_MODEL.format(marker=str(marker)))
    (tmp_path / "a_folder").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["record", str(model), "-o", output]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and ("does not exist" in line if "/" in output else "is a folder" in line)
    assert not marker.exists()  # refused before build(), so before the export


def test_a_build_function_that_raises_says_where(tmp_path, capsys):
    model = tmp_path / "raises.py"
    model.write_text("def helper():\n    raise ValueError('boom')\n\n\ndef build():\n    return helper()\n")
    assert cli.main(["record", str(model), "-o", str(tmp_path / "t.h5")]) == 1
    assert capsys.readouterr().err.strip() == f"error: {model}: build function raised ValueError: boom (at {model}:2)"


def test_no_gpu_says_which_command_checks_code_generation():
    """The message said to use `--compile-only`, which does not exist; the command is `tapml-dbg compile`.

    (The message itself is the worker's, on a machine without the device: `tapml-dbg bisect t.h5
    --target cuda` prints `error: no cuda device on this machine (use --rpc HOST:PORT for a remote
    one, or `tapml-dbg compile` to check code generation only)`.)"""
    from tapml_dbg.runtime.target import NO_DEVICE_HINT

    named = re.findall(r"`tapml-dbg (\w+)`", NO_DEVICE_HINT)
    assert named == ["compile"] and "--compile-only" not in NO_DEVICE_HINT
    assert "compile" in cli.build_parser()._subparsers._group_actions[0].choices
