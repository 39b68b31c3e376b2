"""Run every command of README.md and docs/*.md as written, and make the docs' transcripts again.

The suite's tests/test_docs.py checks, fast, that every documented command parses, and
tests/test_transcripts.py that every transcript is the tool's output. This script runs every
command, and writes the transcripts (the one way they are made):

1. every `tapml-dbg` command of the docs (code blocks and inline spans), in document order, in a
   scratch folder that links `examples/` and `tests/` (so `-o t.h5` lands there, and `traces/`
   is a fresh one); placeholders get real values (TRACE: a recorded examples/mlp.py, DIR: a
   fresh folder), a command on MODEL (the reader's own model) is only parsed, and commands that
   need what this machine may lack (an RPC server or tracker, a CUDA device) are skipped and
   counted;
2. every transcript (tests/transcripts.py says what one is) is made again with the real CLI and
   diffed line by line with the document's, timings blanked; `--write` puts the new output in.

    python benchmarks/docs_check.py            # exit 1 when a command fails or a transcript drifted
    python benchmarks/docs_check.py --transcripts --write   # after changing output: write the docs anew
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

import transcripts  # noqa: E402
from test_docs import DOCS, inline_commands, shell_commands  # noqa: E402

COMMAND_TIMEOUT_S = 900
NEEDS = {"--rpc": "an RPC server", "--tracker": "an RPC tracker"}
GPU_TARGETS = ("cuda", "rocm", "vulkan")
def run(argv: list[str], env: dict, cwd: Path, merged: bool = False) -> subprocess.CompletedProcess:
    """`tapml-dbg ARGV`; `merged`: stderr into stdout, in order (as the docs show it, `2>&1`)."""
    return subprocess.run([sys.executable, "-m", "tapml_dbg", *argv], cwd=cwd, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=COMMAND_TIMEOUT_S)


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
    if argv[:1] == ["serve"]:
        return "a server outlives the command (tests/test_serve.py starts and stops one)"
    for flag, what in NEEDS.items():
        if flag in argv:
            return f"needs {what}"
    if "--target" in argv and argv[argv.index("--target") + 1] in GPU_TARGETS and argv[0] != "compile" \
            and not has_gpu():
        return "needs a GPU"
    return ""


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


def check_transcripts(write: bool = False) -> tuple[int, int]:
    """Make every doc's transcripts again (tests/transcripts.py); print the drifted ones' diffs
    (`write`: put the new output in the doc). Returns (transcripts, drifted)."""
    total = drifted = 0
    for doc in DOCS:
        made = transcripts.make(doc)
        for found, outputs in made:
            total += 1
            changes = transcripts.drift(found, outputs)
            for command, shown, printed in changes:
                print(f"DRIFT {found.name}: `{command}`")
                print("\n".join(list(difflib.unified_diff(shown, printed, "shown", "now", lineterm="", n=1))[:80]))
            drifted += bool(changes)
            if not changes:
                print(f"ok    {found.name}")
        if write and made:
            changed = transcripts.write(doc, made)
            if changed:
                print(f"      wrote {changed} block(s) of new output into {doc.relative_to(ROOT)}")
    return total, drifted


def main() -> int:
    os.environ.setdefault("TAPML_SERVER", "0")  # each command a process of its own, as measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcripts", action="store_true", help="only make the transcripts again (minutes)")
    parser.add_argument("--write", action="store_true", help="replace a drifted transcript in its doc by the new output")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tapml-docs-") as tmp:
        folder = Path(tmp)
        work = transcripts.scratch(folder / "work")
        ok = failed = skipped = 0
        if not args.transcripts:
            ok, failed, skipped = check_commands(folder, work)
        total, drifted = check_transcripts(args.write)
    print(f"\n{ok} commands ran, {failed} failed, {skipped} skipped; {total - drifted} transcripts in step, "
          f"{drifted} drifted")
    return 1 if failed or drifted else 0


if __name__ == "__main__":
    sys.exit(main())
