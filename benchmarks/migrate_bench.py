"""`migrate` vs one mixed run with everything offloaded, in the same run, cold compile cache each.

A migration over N blocks runs N mixed runs; each runs its target ops as chains of per-op kernels
cut at the same block ends (engine/propagation.py), so each distinct op compiles once and a step
reuses the values of the blocks the step before fed the same. This measures what that costs against the cheapest whole-model replay, one
mixed run with everything on the target (`tapml-dbg run TRACE --offload all`), both from an empty
compile cache, and prints one table with the machine and versions.

Usage:
  python benchmarks/migrate_bench.py                          # tiny_llama on llvm
  python benchmarks/migrate_bench.py --model gpt2_124m        # GPT-2 124M (records it: ~1 min, ~1 GB)
  python benchmarks/migrate_bench.py --model gpt2_124m --target cuda   # on a GPU (the H200)
  python benchmarks/migrate_bench.py --trace traces/gpt2.h5 --target cuda   # reuse a recorded trace
Options: --fault OP plants a x1.5 fault at OP (tests/transforms/faults.py:scale), so the culprit
search runs too; --json prints the rows as JSON as well.
Figures are from one run on one machine: compare the ratio, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = "tiny_llama"
FAULT_SCALE = 1.5  # a planted fault large enough to break the output


def machine_text(target: str) -> str:
    import torch
    import tvm

    gpu = ""
    if "cuda" in target:
        try:
            gpu = " gpu " + tvm.cuda(0).device_name
        except Exception:  # noqa: BLE001 - a label only
            gpu = " gpu ?"
    return (f"{platform.machine()} {os.cpu_count()} cores{gpu}, python {platform.python_version()}, "
            f"tvm {tvm.__version__}, torch {torch.__version__}, target {target}")


def timed_session(trace: Path, target: str, cache: Path, transform: str | None):
    """A session on an empty cache, its worker started and the float64 reference computed (not timed)."""
    from tapml_dbg.engine.session import Session

    shutil.rmtree(cache, ignore_errors=True)
    session = Session.open(trace, target=target, transform=transform, cache_dir=cache)
    session.reference.full_run()  # the references every verdict reads: the same cost for both, paid once
    session.lanes.run(session.requests.compile_only(0))  # the worker's start-up is nobody's cost
    return session


def bench(trace: Path, target: str, work: Path, transform: str | None) -> dict:
    row: dict = {"trace": trace.name, "target": target}
    with timed_session(trace, target, work / "cache-all", transform) as session:
        row["ops"] = len(session.ops)
        row["blocks"] = len(session.mixed_runner.blocks)
        started = time.perf_counter()
        everything = session.run_mixed(list(range(len(session.ops))), verdicts=False)
        row["all offloaded s"] = time.perf_counter() - started
        row["all offloaded units"] = everything.units
        row["all offloaded compiled"] = everything.compiled
        row["all offloaded passed"] = everything.passed
    with timed_session(trace, target, work / "cache-migrate", transform) as session:
        started = time.perf_counter()
        result = session.migrate()
        row["migrate s"] = time.perf_counter() - started
        row["steps"] = len(result.steps)
        row["migrate units"] = result.units
        row["migrate compiled"] = result.compiled
        row["migrate reused"] = result.reused
        row["first failing step"] = result.first_failing_step
        row["culprit"] = f"#{result.culprit.index} {result.culprit.name}" if result.culprit else None
        row["culprit probes"] = result.probes
        row["step errors"] = [None if step.run.error == float("inf") else float(f"{step.run.error:.3g}")
                              for step in result.steps]
    row["ratio"] = row["migrate s"] / row["all offloaded s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="an example name (tiny_llama, gpt2_124m, ...)")
    parser.add_argument("--trace", help="a recorded trace to reuse instead of recording --model")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--fault", metavar="OP", help="plant a x1.5 fault at this op (the culprit search runs)")
    parser.add_argument("--work", help="folder for the trace and the caches (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from conftest import fault_transform
    from tapml_dbg.record.recorder import record

    work = Path(args.work or tempfile.mkdtemp(prefix="tapml-migrate-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.trace:
        trace = Path(args.trace)
    else:
        trace = work / f"{args.model}.h5"
        if not trace.exists():
            started = time.perf_counter()
            record(str(ROOT / "examples" / f"{args.model}.py"), trace)
            print(f"recorded {trace} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    transform = fault_transform(work, "scale", args.fault, scale=FAULT_SCALE) if args.fault else None
    row = bench(trace, args.target, work, transform)
    print(f"machine: {machine_text(args.target)}")
    width = max(len(key) for key in row)
    for key, value in row.items():
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        print(f"  {key:<{width}}  {shown}")
    print(f"migrate over {row['steps']} steps costs {row['ratio']:.2f}x one mixed run with everything offloaded "
          f"({row['migrate compiled']} units compiled vs {row['all offloaded compiled']})")
    if args.json:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
