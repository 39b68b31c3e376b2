"""Run every command of README.md and docs/*.md as written, and diff the REPL transcripts.

The suite's tests/test_docs.py checks, fast, that every documented command parses and that the
README's and docs/repl.md's transcripts still print their key lines. This script does the slow,
complete version, to run before a release or after changing output:

1. every `tapml-dbg` command of the docs (code blocks and inline spans), in document order, in a
   scratch folder that links `examples/` and `tests/` (so `-o t.h5` lands there, and `traces/`
   is a fresh one); placeholders get real values (TRACE: a recorded examples/mlp.py, DIR: a
   fresh folder), a command on MODEL (the reader's own model) is only parsed, and commands that
   need what this machine may lack (an RPC server or tracker, a CUDA device) are skipped and
   counted;
2. every REPL transcript that says how it was made (the README's session, docs/repl.md's
   walk-through and one-liner) is made again with the real CLI, and its output is diffed line by
   line with the document's, timings and sizes blanked.

    python benchmarks/docs_check.py            # exit 1 when a command fails or a transcript drifted
    python benchmarks/docs_check.py --transcripts --write   # after changing output: refresh the docs
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from test_docs import DOCS, NUMBERS_THAT_VARY, code_blocks, inline_commands, shell_commands  # noqa: E402

COMMAND_TIMEOUT_S = 900
NEEDS = {"--rpc": "an RPC server", "--tracker": "an RPC tracker"}
GPU_TARGETS = ("cuda", "rocm", "vulkan")
# transcripts and the command line that printed them (the docs say so next to each)
TRANSCRIPTS = [  # (doc, the transcript's first line, the commands that print it, their environment)
    ("README.md", "recorded 19 ops to traces/demo.h5",
     [["record", "examples/fp16_memory_attention.py", "-o", "traces/demo.h5"], ["bisect", "traces/demo.h5"]], {}),
    ("README.md", "(llvm) #0 view [query]> continue",
     [["replay", "traces/demo.h5", "-c", "continue; compare 9; plot; dump 9 /tmp/repro-softmax; continue"]], {}),
    ("docs/repl.md", "recorded 26 ops to /tmp/mlp.h5", [["record", "examples/mlp.py", "-o", "/tmp/mlp.h5"]], {}),
    ("docs/repl.md", "(llvm) #0 permute [proj]> where",
     [["replay", "/tmp/mlp.h5", "--transform", "tests/transforms/faults.py:scale", "--script", "{script}"]],
     {"TAPML_FAULT_OP": "gelu_1"}),
    ("docs/repl.md", "(llvm) #0 permute [proj]> break nan",
     [["replay", "/tmp/mlp.h5", "--transform", "tests/transforms/faults.py:nan", "-c", "break nan; continue"]],
     {"TAPML_FAULT_OP": "gelu_1"}),
]


def run(argv: list[str], env: dict, cwd: Path, merged: bool = False) -> subprocess.CompletedProcess:
    """`tapml-dbg ARGV`; `merged`: stderr into stdout, in order (as the docs show it, `2>&1`)."""
    return subprocess.run([sys.executable, "-m", "tapml_dbg", *argv], cwd=cwd, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=COMMAND_TIMEOUT_S)


def scratch(folder: Path) -> Path:
    """A working folder where the docs' relative paths resolve: examples/ and tests/ linked, traces/ fresh."""
    work = folder / "work"
    (work / "traces").mkdir(parents=True)
    for name in ("examples", "tests"):
        (work / name).symlink_to(ROOT / name)
    return work


def succeeded(argv: list[str], done: subprocess.CompletedProcess) -> bool:
    """Exit 0; or a replay whose script holds a command that fails on purpose (a typo), without a traceback."""
    text = done.stdout + (done.stderr or "")
    return done.returncode == 0 or (argv[0] == "replay" and done.returncode == 1 and "Traceback" not in text
                                    and "internal error" not in text)


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0


def substitute(argv: list[str], folder: Path, trace: Path) -> list[str]:
    values = {"TRACE": str(trace), "DIR": str(folder / "out")}
    return [values.get(word, word) for word in argv]


def skip_reason(argv: list[str]) -> str:
    if "MODEL" in argv:
        return "MODEL stands for the reader's model: parsed by tests/test_docs.py, not run"
    for flag, what in NEEDS.items():
        if flag in argv:
            return f"needs {what}"
    if "--target" in argv and argv[argv.index("--target") + 1] in GPU_TARGETS and argv[0] != "compile" \
            and not has_gpu():
        return "needs a GPU"
    return ""


def normalized(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for pattern, replacement in NUMBERS_THAT_VARY:
            line = pattern.sub(replacement, line)
        out.append(line.rstrip())
    return out


def check_commands(folder: Path, work: Path) -> tuple[int, int, int]:
    trace = folder / "mlp.h5"
    assert run(["record", "examples/mlp.py", "-o", str(trace)], {}, work).returncode == 0
    ok = failed = skipped = 0
    for doc in DOCS:
        for command in shell_commands(doc) + inline_commands(doc):
            argv = substitute(command.argv, folder, trace)
            reason = skip_reason(argv)
            name = f"{doc.relative_to(ROOT)}: {command.line}"
            if reason:
                skipped += 1
                print(f"skip  {name}  ({reason})")
                continue
            started = time.perf_counter()
            done = run(argv, command.env, work)
            seconds = time.perf_counter() - started
            if succeeded(argv, done):
                ok += 1
                print(f"ok    {name}  ({seconds:.1f} s)")
            else:
                failed += 1
                print(f"FAIL  {name}  (exit {done.returncode}): {(done.stderr or '').strip().splitlines()[-1:]}")
    return ok, failed, skipped


def check_transcripts(folder: Path, work: Path, write: bool = False) -> int:
    """Make each transcript again; print the drifted ones' diffs (`write`: put the new output in the doc)."""
    drifted = 0
    for doc_name, first_line, commands, env in TRANSCRIPTS:
        block = next(b for b in code_blocks(ROOT / doc_name) if first_line in b)
        shown = []
        for line in block[block.index(first_line):].splitlines():
            if line.startswith("$ "):
                break  # the next shell command (`$ echo $?`): the transcript ends here
            shown.append(line)
        printed = []
        for argv in commands:
            if "{script}" in argv:
                script = folder / "walkthrough.tapml"
                script.write_text(next(b for b in code_blocks(ROOT / doc_name) if b.startswith("where\n")))
                argv = [str(script) if word == "{script}" else word for word in argv]
            printed += run(argv, env, work, merged=True).stdout.rstrip("\n").splitlines()
        diff = list(difflib.unified_diff(normalized(shown), normalized(printed), f"{doc_name} (shown)", "now",
                                         lineterm="", n=1))
        if diff:
            drifted += 1
            print(f"DRIFT {doc_name}: {first_line}")
            print("\n".join(diff[:80]))
            if write:
                path = ROOT / doc_name
                path.write_text(path.read_text().replace("\n".join(shown), "\n".join(printed), 1))
                print(f"      wrote the new output into {doc_name}")
        else:
            print(f"ok    {doc_name}: transcript from `{first_line}` ({len(shown)} lines)")
    return drifted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcripts", action="store_true", help="only make the transcripts again (minutes)")
    parser.add_argument("--write", action="store_true", help="replace a drifted transcript in its doc by the new output")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tapml-docs-") as tmp:
        folder = Path(tmp)
        work = scratch(folder)
        ok = failed = skipped = 0
        if not args.transcripts:
            ok, failed, skipped = check_commands(folder, work)
        drifted = check_transcripts(folder, work, args.write)
    print(f"\n{ok} commands ran, {failed} failed, {skipped} skipped; {len(TRANSCRIPTS) - drifted} transcripts "
          f"in step, {drifted} drifted")
    return 1 if failed or drifted else 0


if __name__ == "__main__":
    sys.exit(main())
