"""Bisect vs a linear per-op scan, cold and warm compile cache, on real-size traces.

"no-sweep" is the pure binary search over fused prefixes (`bisect --no-sweep`); the default
bisect adds the isolated sweep below the candidate, which is what makes it correct when a
fault washes out downstream. The scan stops at the first op whose isolated verdict fails.

Usage: python benchmarks/bisect_bench.py [MODEL ...]   (default: tiny_llama and gpt2_124m)

For each model: record a trace once, plant a 1% fault at the op in the middle (through the
same --transform mechanism the tests use), then time
  - bisect with an empty compile cache (cold) and again with the cache filled (warm),
  - a linear scan computing every op's isolated verdict one unit per op (cold and warm),
and print one table with the machine and versions. Figures are from one run on one machine:
compare the ratios, not the absolute seconds.
"""

from __future__ import annotations

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

DEFAULT_MODELS = ["tiny_llama", "gpt2_124m"]


def main(models: list[str]) -> None:
    from conftest import fault_transform
    from tapml_dbg.record.recorder import record
    from tapml_dbg.engine.session import Session

    work = Path(tempfile.mkdtemp(prefix="tapml-bench-"))
    rows = []
    for model in models:
        trace = work / f"{model}.h5"
        recorded = record(str(ROOT / "examples" / f"{model}.py"), trace)
        with Session.open(trace) as session:
            middle = middle_op(session)
        transform = fault_transform(work, "scale", middle)
        cache = work / f"cache-{model}"
        row = {"model": model, "ops": recorded.ops, "fault at": f"#{session.by_name[middle].index} {middle}"}
        for phase in ("cold", "warm", "warm no-sweep"):
            if phase == "cold":
                shutil.rmtree(cache, ignore_errors=True)
            with Session.open(trace, transform=transform, cache_dir=cache) as session:
                session.isolated(0)  # start the worker: its start-up is not the search's cost
                started = time.perf_counter()
                result = session.bisect(sweep=phase != "warm no-sweep")
                row[f"bisect {phase} s"] = time.perf_counter() - started
                key = "probes" if phase != "warm no-sweep" else "probes no-sweep"
                row[key] = result.probes
                row["found"] = result.culprit.name == middle if result.culprit else False
        scan_cache = work / f"scan-{model}"
        for phase in ("cold", "warm"):
            if phase == "cold":
                shutil.rmtree(scan_cache, ignore_errors=True)
            with Session.open(trace, transform=transform, cache_dir=scan_cache) as session:
                session.isolated(len(session.ops) - 1)  # start the worker
                started = time.perf_counter()
                first = next((op.index for op in session.ops if session.isolated(op.index).failed), None)
                row[f"scan {phase} s"] = time.perf_counter() - started
                row["scan units"] = len(session.ops)
                row["scan found"] = first == session.by_name[middle].index
        rows.append(row)
    _print(rows)
    shutil.rmtree(work, ignore_errors=True)


def middle_op(session, fraction: float = 0.5) -> str:
    """The first plain float32 op from the middle on (or from `fraction` of the ops on): where the
    benchmarks plant their fault."""
    for op in session.ops[int(len(session.ops) * fraction):]:
        if op.outputs and op.outputs[0].dtype == "float32" and op.relax_op.startswith("relax.") \
                and "reshape" not in op.relax_op and not op.is_tuple:
            return op.name
    raise SystemExit("no float op to plant a fault in")


def _print(rows: list[dict]) -> None:
    import numpy
    import torch
    import tvm

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, tvm {tvm.__version__}, "
          f"numpy {numpy.__version__}")
    columns = ["model", "ops", "fault at", "probes", "found", "bisect cold s", "bisect warm s",
               "probes no-sweep", "bisect warm no-sweep s", "scan units", "scan found", "scan cold s", "scan warm s"]
    print("| " + " | ".join(columns) + " | speed-up cold | speed-up warm |")
    print("|" + "---|" * (len(columns) + 2))
    for row in rows:
        cells = [f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        cold = row["scan cold s"] / row["bisect cold s"]
        warm = row["scan warm s"] / row["bisect warm s"]
        print("| " + " | ".join(cells) + f" | {cold:.1f}x | {warm:.1f}x |")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT_MODELS)
