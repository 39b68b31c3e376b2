"""The transcripts of README.md and docs/*.md: found in the docs, made again, compared, written back.

One mechanism for the suite (tests/test_transcripts.py fails when the tool's output drifts from a
doc) and for the script that writes them (`python benchmarks/docs_check.py --transcripts --write`).

A transcript is a fenced block that either
- starts with a `$ ` line: every `$ ` line is a shell command, and the lines up to the next `$ `
  line are what it prints (stdout and stderr, in order); or
- follows a `<!-- transcript: COMMAND -->` line: the block is what COMMAND prints (a REPL session
  made with `-c` or `--script`); `$ ` lines at its top are what a reader would type and are shown,
  not compared.
Before a block, `<!-- transcript setup: COMMAND -->` lines run first without being shown (a trace
the block reads, a damaged copy), `<!-- transcript file: NAME -->` before a block writes that
block to NAME (a `--script` file) in the doc's folder, and `<!-- transcript varies: REGEX -->` says,
in the doc, which part of the block differs from run to run by nature (the values of an
out-of-bounds read): what REGEX matches is not compared.

Each doc runs in a scratch folder of its own (/tmp/tapml-doc-XXXXXXXX), its blocks in document order (a block reads what the
blocks above it wrote), with `examples/` and `tests/` linked in and `/tmp/` mapped into the
folder. Only timings are blanked when comparing: every count, size and error is the tool's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```\n?", re.S | re.M)
MARKER = re.compile(r"^<!-- transcript(?: (?P<kind>setup|file|varies))?: (?P<text>.*?) -->$")
COMMAND_TIMEOUT_S = 900
TIMINGS = [(re.compile(r"\b\d+(\.\d+)? (s|ms|us)\b"), "N \\2"), (re.compile(r"\b\d+(\.\d+)?x the bare"), "Nx the bare"),
           # `record`'s eager figure: a ratio, or too short for one, by how fast the machine ran it
           (re.compile(r" = Nx the bare eager forward \(N \w+, warm\)| \(the bare eager forward: N \w+, warm, too "
                       r"short for a ratio\)"), " (the bare eager forward: N, warm)")]
TMP = "/tmp/"
# every scratch folder's path is as long as every other's (a fixed prefix and 8 random characters), so
# what the tool writes with paths in it (a repro's README and meta) has the same size in every run
SCRATCH_PARENT, SCRATCH_PREFIX = "/tmp", "tapml-doc-"
CACHE_FOLDER = ".compile-cache"  # in the scratch folder: each doc starts from an empty compile cache
ENV_DROPPED = ("COLUMNS", "LINES", "TAPML_FAULT_OP", "FORCE_COLOR")  # the tool's output must not depend on them


@dataclass
class Command:
    line: str  # as the doc shows it, without `$ `
    shown: list[str] = field(default_factory=list)  # what the doc says it prints


@dataclass
class Transcript:
    doc: Path
    start: int  # the block's offset in the doc
    end: int
    commands: list[Command]
    setup: list[str] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)  # `$ ` lines shown above a marker's output
    file: str = ""  # a script block: written to this name, not run
    varies: list[str] = field(default_factory=list)  # regexes of what differs between runs by nature
    made_by: bool = False  # made by a marker's command, not by the `$ ` lines it shows

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.doc.read_text()[:self.start].count(chr(10)) + 1}"

    def text(self, outputs: list[list[str]]) -> str:
        """The block as it should read, for these outputs of its commands."""
        lines = [f"$ {line}" for line in self.typed]
        for command, output in zip(self.commands, outputs):
            if not self.made_by:
                lines.append(f"$ {command.line}")
            blank_after = len(command.shown) - len("\n".join(command.shown).rstrip("\n").splitlines())
            lines += output + [""] * blank_after  # the doc's spacing between commands kept
        return "\n".join(lines) + "\n"


def transcripts(doc: Path) -> list[Transcript]:
    """Every transcript and script block of `doc`, in order."""
    text = doc.read_text()
    found = []
    for block in BLOCK.finditer(text):
        before = text[:block.start()].rstrip("\n").splitlines()
        markers = []
        while before and MARKER.match(before[-1]):
            markers.insert(0, MARKER.match(before.pop()))
        while before and not before[-1].strip() and markers:
            before.pop()
        lines = block.group(1).splitlines()
        setup = [m.group("text") for m in markers if m.group("kind") == "setup"]
        files = [m.group("text") for m in markers if m.group("kind") == "file"]
        made_by = [m.group("text") for m in markers if m.group("kind") is None]
        varies = [m.group("text") for m in markers if m.group("kind") == "varies"]
        span = (block.start(1), block.end(1))
        if files:
            found.append(Transcript(doc, *span, [], setup, file=files[0]))
        elif made_by:  # one command line for all of them: their output is the block's
            typed = [line[2:] for line in _leading_typed(lines)]
            found.append(Transcript(doc, *span, [Command("; ".join(made_by), lines[len(typed):])], setup, typed,
                                    made_by=True, varies=varies))
        elif lines and lines[0].startswith("$ "):
            commands = []
            for line in lines:
                if line.startswith("$ "):
                    commands.append(Command(line[2:]))
                else:
                    commands[-1].shown.append(line)
            found.append(Transcript(doc, *span, commands, setup, varies=varies))
        elif setup:
            raise ValueError(f"{doc.name}: a `transcript setup` marker before a block that is not a transcript")
    return found


def _leading_typed(lines: list[str]) -> list[str]:
    typed = []
    for line in lines:
        if not line.startswith("$ "):
            break
        typed.append(line)
    return typed


def scratch(folder: Path) -> Path:
    """A folder where the docs' relative paths resolve: examples/ and tests/ linked, traces/ and tmp/ fresh."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("traces", "tmp"):
        (folder / name).mkdir(exist_ok=True)
    for name in ("examples", "tests", "benchmarks"):
        if not (folder / name).exists():
            (folder / name).symlink_to(ROOT / name)
    return folder


def environment(folder: Path, shims: str | None = None) -> dict:
    """A reader's first run: this interpreter's `tapml-dbg`, and a compile cache of the doc's own that
    starts empty (what a doc says it compiled, and the probes a search took, are then the same in
    every run, whatever the suite compiled before it). `shims`: a folder whose `tapml-dbg` and `python` come
    first (the suite's, tests/fork_cli.py: the same command or script, forked from a process that
    has imported torch and TVM)."""
    env = {key: value for key, value in os.environ.items() if key not in ENV_DROPPED}
    bin_dir = Path(sys.executable).parent
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # `tapml-dbg` and `python` of this interpreter
    if shims:
        env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    env["TAPML_CACHE_DIR"] = str(folder / CACHE_FOLDER)
    return env


class Shell:
    """A reader's shell in `folder`: bash for `;`, `&&` and quoting, and `$?` is the last command's status."""

    def __init__(self, folder: Path, shims: str | None = None):
        self.folder = folder
        self.shims = shims
        self.status = 0

    def run(self, line: str) -> list[str]:
        """One doc command, stdout and stderr merged, the folder's paths written as the doc writes them."""
        mapped = f"(exit {self.status}); " + line.replace(TMP, f"{self.folder}/tmp/")
        done = subprocess.run(["bash", "-c", mapped], cwd=self.folder, env=environment(self.folder, self.shims), text=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=COMMAND_TIMEOUT_S)
        self.status = done.returncode
        output = done.stdout.replace(f"{self.folder}/tmp/", TMP).replace(f"{self.folder}/", "")
        return [line.rstrip() for line in output.rstrip("\n").splitlines()]


def make(doc: Path, shims: str | None = None) -> list[tuple[Transcript, list[list[str]]]]:
    """Run every transcript of `doc` in order in a scratch folder; each with its commands' outputs."""
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=SCRATCH_PARENT) as tmp:
        folder = Path(tmp)
        shell = Shell(scratch(folder), shims)
        made = []
        for found in transcripts(doc):
            for line in found.setup:
                shell.run(line)
            if found.file:
                (folder / found.file).write_text(doc.read_text()[found.start:found.end].replace(TMP, f"{folder}/tmp/"))
                continue
            made.append((found, [shell.run(command.line) for command in found.commands]))
    return made


def blank_timings(lines: list[str], varies: list[str] = ()) -> list[str]:
    """The lines as compared: timings blanked, and what the doc says varies by nature."""
    patterns = TIMINGS + [(re.compile(regex), "…") for regex in varies]
    out = []
    for line in lines:
        for pattern, replacement in patterns:
            line = pattern.sub(replacement, line)
        out.append(line.rstrip())
    while out and not out[-1]:
        out.pop()
    return out


def drift(found: Transcript, outputs: list[list[str]]) -> list[tuple[str, list[str], list[str]]]:
    """(command, shown, printed) of each command whose output is not what the doc shows."""
    return [(command.line, blank_timings(command.shown, found.varies), blank_timings(output, found.varies))
            for command, output in zip(found.commands, outputs)
            if blank_timings(command.shown, found.varies) != blank_timings(output, found.varies)]


def write(doc: Path, made: list[tuple[Transcript, list[list[str]]]]) -> int:
    """Put the new outputs of the drifted blocks into `doc` (a block that differs in its timings only is
    left as it is: no churn); from the last block, so offsets stay right. Returns the blocks changed."""
    text = doc.read_text()
    changed = 0
    for found, outputs in reversed(made):
        new = found.text(outputs)
        if drift(found, outputs) and text[found.start:found.end] != new:
            text = text[:found.start] + new + text[found.end:]
            changed += 1
    doc.write_text(text)
    return changed
