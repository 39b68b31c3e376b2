"""A generation's bisect against a single forward's, same model, same run, cold compile cache each.

Issue [15]'s target: bisecting a 16-step generation of examples/tiny_llama.py (`causal_lm`, the bare
LlamaForCausalLM: a prefill of 16 positions + 16 decode steps with a KV cache, one unrolled graph)
costs at most 3x a bisect of one forward of the same model (its prefill alone). The generation has
~17x the ops; what keeps it cheap is that identical ops in different steps share one compiled kernel
(a decode step's projections, norms and MLP have the same shapes at every step; only the attention
over the growing cache differs), and that the per-op chain is one run of the model.

Both traces are recorded first (not timed); each bisect then runs in a fresh session on an empty
compile cache, the worker started and the float64 references computed before the clock starts (the
same for both). The generation's figure includes its tokens phase (one more chained run: the first
bad token and per-step KL). Prints one table with the machine and versions.

Usage:
  python benchmarks/generation_bench.py                  # tiny_llama, 16 decode steps, llvm
  python benchmarks/generation_bench.py --steps 8 --target cuda
  python benchmarks/generation_bench.py --fault OP       # plant a x1.5 fault at OP (faults.py:scale)
  python benchmarks/generation_bench.py --repeat 5       # each bisect 5 times (default 3), alternated
Figures are from one run on one machine: compare the ratio (of the medians), not the absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from migrate_bench import machine_text, timed_session  # noqa: E402 (a script beside this one)

MODEL = f"{ROOT / 'examples' / 'tiny_llama.py'}:causal_lm"
TARGET_RATIO = 3.0  # issue [15]: a 16-step generation's bisect at most 3x a single forward's


def record_both(folder: Path, steps: int) -> tuple[Path, Path]:
    from tapml_dbg.record.recorder import record

    forward, generation = folder / "forward.h5", folder / f"generation{steps}.h5"
    record(MODEL, forward)
    record(MODEL, generation, generate=steps)
    return forward, generation


def bisect_seconds(trace: Path, target: str, cache: Path, transform: str | None) -> tuple[float, dict]:
    session = timed_session(trace, target, cache, transform)
    try:
        started = time.perf_counter()
        result = session.bisect()
        seconds = time.perf_counter() - started
        return seconds, {"ops": result.ops, "diverged": result.diverged, "units": session.lanes.units,
                         "first_bad_token": result.to_json()["first_bad_token"]}
    finally:
        session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--fault", metavar="OP", help="plant a x1.5 fault at OP (both traces must have it)")
    parser.add_argument("--repeat", type=int, default=3, help="bisects of each trace, alternated (median)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tapml-gen-bench-") as scratch:
        folder = Path(scratch)
        transform = None
        if args.fault:
            from conftest import fault_transform

            transform = fault_transform(folder, "scale", args.fault, scale=1.5)
        forward, generation = record_both(folder, args.steps)
        labels = {forward: "single forward (prefill)", generation: f"generation, {args.steps} decode steps"}
        runs: dict = {forward: [], generation: []}
        for round_ in range(args.repeat):  # alternated, so that a slow minute of a shared machine hits both
            for trace in ((forward, generation) if round_ % 2 == 0 else (generation, forward)):
                runs[trace].append(bisect_seconds(trace, args.target, folder / "cache", transform))
    rows = []
    for trace, done in runs.items():
        seconds = sorted(run[0] for run in done)
        rows.append({"run": labels[trace], "seconds": statistics.median(seconds), "each": seconds, **done[-1][1]})
    ratio = rows[1]["seconds"] / rows[0]["seconds"]
    print(machine_text(args.target))
    print(f"{'bisect (median of ' + str(args.repeat) + ', cold each)':<34} {'ops':>6} {'units run':>10} {'seconds':>8}  each")
    for row in rows:
        each = " ".join(f"{s:.1f}" for s in row["each"])
        print(f"{row['run']:<34} {row['ops']:>6} {row['units']:>10} {row['seconds']:>8.2f}  {each}")
    print(f"generation / single forward: {ratio:.2f}x (target: at most {TARGET_RATIO:.0f}x)")
    if args.json:
        print(json.dumps({"rows": rows, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
