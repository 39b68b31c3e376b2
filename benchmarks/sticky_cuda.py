"""Sticky CUDA faults on a real GPU: the same trace bisected three times must give one answer.

examples/qwen2_several_bugs.py at 128 positions holds TVM 0.27's bool `cumsum` (imported as bool where
torch gives int64), which on CUDA aborts with cudaErrorMisalignedAddress and poisons the process
(docs/reliability.md "Sticky faults"). This records it, bisects it on `--target cuda` RUNS times and
triages it once, bisects again with the first answer kept on the source, and prints each answer:

    python benchmarks/sticky_cuda.py [--seq 128] [--runs 3] [--target cuda] [--model FILE.py:FUNC] [--no-triage]

`--model` records another model instead, e.g. `examples/llama_1b.py:build_without_mask` (issue [17]'s
1.1B Llama, whose mask code holds the same `cumsum`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = """
import sys
sys.path.insert(0, {examples!r})
from qwen2_several_bugs import build as _build

def build():
    return _build(seq={seq})
"""


def tool(*args: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tapml_dbg", *args], capture_output=True, text=True, cwd=ROOT)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - started


def main() -> int:
    os.environ.setdefault("TAPML_SERVER", "0")  # each command a process of its own, as measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--model", help="FILE.py[:FUNC] to record instead of the qwen2 example at --seq")
    parser.add_argument("--no-triage", action="store_true", help="skip the triage (minutes on the 1.1B model)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "qwen2_long.py"
            model.write_text(MODEL.format(examples=str(ROOT / "examples"), seq=args.seq))
        trace = Path(tmp) / "model.h5"
        code, text, seconds = tool("record", str(model), "-o", str(trace))
        print(f"record: exit {code} in {seconds:.1f} s: {text.splitlines()[0] if text else ''}")
        answers = []
        for run in range(args.runs):
            code, text, seconds = tool("bisect", str(trace), "--target", args.target, "--json")
            try:
                found = json.loads(text[text.index("{"):])
                op = found.get("op") or {}
                answer = (op.get("index"), op.get("name"), op.get("verdict"))
            except ValueError:
                answer = ("no JSON", text.strip().splitlines()[-1:] if text else "")
            answers.append(answer)
            print(f"bisect run {run + 1}: exit {code} in {seconds:.1f} s: {answer}; message: "
                  f"{(op.get('message') or '')[:160] if isinstance(answer[0], int) else ''}")
        print(f"bisect answers agree: {len(set(map(str, answers))) == 1}")
        if not args.no_triage:
            code, text, seconds = tool("triage", str(trace), "--target", args.target)
            print(f"triage: exit {code} in {seconds:.1f} s")
            print("\n".join(line[:200] for line in text.splitlines()[:40]))
        first = answers[0][0] if answers and isinstance(answers[0][0], int) else None
        if first is None:
            return 0
        code, text, seconds = tool("bisect", str(trace), "--target", args.target, "--keep", str(first))
        print(f"bisect --keep {first}: exit {code} in {seconds:.1f} s")
        print("\n".join(line[:200] for line in text.splitlines()[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
