"""Parallel probes: one vs two RPC servers behind a tracker, on real example traces.

Usage: python benchmarks/parallel_bench.py [--models tiny_gpt2 tiny_llama] [--repeat N] [--local]

Starts a tracker and two `tvm.exec.rpc_server`s on 127.0.0.1 (key `cpu`), records each model
once, then times, for each workload, a session that uses one lane (`--parallel 1`: one leased
server) and one that uses one lane per free server (the default: two):

  - isolated sweep: every op's isolated verdict (`Verdicts.isolated_many`), batched
  - compile_all:    every op compiled alone (what `tapml-dbg compile` does)
  - bisect:         a 1% fault planted in the middle op, found with the sweep

Each timed run gets a fresh compile cache, so it compiles everything; the time includes starting
the lanes' workers (each imports TVM), which is part of what parallelism costs. Runs of the two
settings alternate, `--repeat` times each; the table shows the median, the speed-up is the
ratio of medians, and the CPU column is the seconds of CPU all processes used (this process,
its workers, the servers' sessions), which tells a busy machine from a slow program.
`--local` adds rows for local lanes (`--parallel 1` vs `--parallel 2`, no RPC).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from bisect_bench import middle_op  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

KEY = "cpu"
DEFAULT_MODELS = ["tiny_gpt2", "tiny_llama"]
WORKLOADS = ["isolated sweep", "compile_all", "bisect"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--local", action="store_true", help="also time local lanes (no RPC)")
    args = parser.parse_args()

    from conftest import fault_transform
    from rpc_helpers import Server, Tracker
    from tapml_dbg.record.recorder import record
    from tapml_dbg.engine.session import Session

    work = Path(tempfile.mkdtemp(prefix="tapml-parallel-bench-"))
    tracker = Tracker()
    servers = [Server(tracker=tracker.address, key=KEY) for _ in range(2)]
    rows = []
    try:
        tracker.wait_for_servers(KEY, 2)
        for model in args.models:
            trace = work / f"{model}.h5"
            record(str(ROOT / "examples" / f"{model}.py"), trace)
            with Session.open(trace) as session:
                middle = middle_op(session)
                ops = len(session.ops)
            transform = fault_transform(work, "scale", middle)
            settings = [("1 server", dict(tracker=tracker.address, key=KEY, parallel=1)),
                        ("2 servers", dict(tracker=tracker.address, key=KEY))]
            if args.local:
                settings += [("local, 1 lane", dict(parallel=1)), ("local, 2 lanes", dict(parallel=2))]
            for workload in WORKLOADS:
                samples: dict[str, list[tuple[float, float, str]]] = {name: [] for name, _ in settings}
                for run in range(args.repeat):
                    for name, options in settings:
                        if "tracker" in options:  # the last session's servers registered again
                            tracker.wait_for_servers(KEY, 2)
                        cache = work / f"cache-{model}-{workload}-{name}-{run}".replace(" ", "_").replace(",", "")
                        samples[name].append(_timed(Session, trace, workload, options, cache, transform, middle))
                        shutil.rmtree(cache, ignore_errors=True)
                for pair in [("1 server", "2 servers"), ("local, 1 lane", "local, 2 lanes")]:
                    if pair[0] not in samples:
                        continue
                    base = statistics.median(s for s, _, _ in samples[pair[0]])
                    for name in pair:
                        seconds = [s for s, _, _ in samples[name]]
                        rows.append({"model": f"{model} ({ops} ops)", "workload": workload, "setting": name,
                                     "lanes": samples[name][0][2], "s": statistics.median(seconds),
                                     "runs": " ".join(f"{s:.1f}" for s in seconds),
                                     "cpu s": statistics.median(c for _, c, _ in samples[name]),
                                     "speed-up": base / statistics.median(seconds)})
    finally:
        for server in servers:
            server.stop()
        tracker.stop()
        shutil.rmtree(work, ignore_errors=True)
    _print(rows)


def _timed(Session, trace, workload, options, cache, transform, middle) -> tuple[float, float, str]:
    cpu_before = _cpu()
    with Session.open(trace, cache_dir=cache, transform=transform if workload == "bisect" else None,
                      **options) as session:
        lanes = str(session.pool.size)
        started = time.perf_counter()
        if workload == "isolated sweep":
            verdicts = session.verdicts.isolated_many(range(len(session.ops)))
            assert all(v.status in ("pass", "missing") for v in verdicts.values()), "a clean trace failed"
        elif workload == "compile_all":
            assert session.compile_all().failed == 0
        else:
            result = session.bisect()
            assert result.culprit is not None and result.culprit.name == middle, result.culprit
        seconds = time.perf_counter() - started
    return seconds, _cpu() - cpu_before, lanes


def _cpu() -> float:
    """CPU seconds of this process and of every child it waited for (workers; servers are separate)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _print(rows: list[dict]) -> None:
    import numpy
    import torch
    import tvm

    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, "
          f"{platform.system()} {platform.release()}; load average now {os.getloadavg()[0]:.2f} "
          "(other users' work included)")
    print(f"versions: python {platform.python_version()}, tvm {tvm.__version__}, torch {torch.__version__}, "
          f"numpy {numpy.__version__}")
    print("two tvm.exec.rpc_server on 127.0.0.1 behind one tvm.exec.rpc_tracker, key cpu, target llvm; "
          "fresh compile cache per run; seconds = median of the runs listed")
    print()
    headers = ["model", "workload", "setting", "lanes", "s", "runs", "cpu s", "speed-up"]
    table = [[_fmt(row[h]) for h in headers] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in table:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    print("\ncpu s counts this process and its workers (not the RPC servers' session processes).")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


if __name__ == "__main__":
    main()
