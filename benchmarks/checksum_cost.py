"""What the trace checksums (format v1.2, `@crc32` on every dataset) cost: record and replay, with and without.

Usage: python benchmarks/checksum_cost.py [MODEL] [--repeat N]   (default examples/gpt2_124m.py, 2)

Every measurement runs in a fresh subprocess. "Without" runs the same code with the checksum
switched off by a `sitecustomize.py` on PYTHONPATH (the writer stores 0, the reader skips the
comparison), so the product itself has no switch to turn checksums off. Measured:

- record: `tapml-dbg record` wall time, and the recorder's own run phase (every op, its stats,
  its writes: where the writer computes the checksums);
- read: every tensor of the trace read once through `TraceReader` (inputs, params, every op's
  outputs): the most a replay reads, and where the reader verifies;
- bisect: `tapml-dbg bisect --no-sweep` of the recorded trace on llvm with a warm compile cache,
  so what differs is reading and verifying, not compiling.

Runs alternate with / without, `--repeat` times; the table shows the best of each.
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

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "examples" / "gpt2_124m.py"

SITE_OFF = '''
import tapml_dbg.trace.h5safe as _h5safe
import tapml_dbg.trace.schema as _schema
_schema.checksum = lambda data: 0
_h5safe.verify_checksum = lambda array, expected, part: None
'''

READ_ALL = '''
import json, sys, time
from tapml_dbg.trace import TraceReader
started = time.perf_counter()
nbytes = 0
with TraceReader(sys.argv[1]) as reader:
    for name in reader.outline.input_names:
        nbytes += reader.tensors.input(name).nbytes
    for name in reader.outline.param_names:
        nbytes += reader.tensors.param(name).nbytes
    for index in reader.recorded.finished_ops():
        nbytes += sum(value.nbytes for value in reader.tensors.op_outputs(index))
print(json.dumps({"seconds": time.perf_counter() - started, "bytes": nbytes}))
'''


def _env(checksums: bool, site: Path) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT)] + ([] if checksums else [str(site)])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def _timed(command: list[str], env: dict) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, done.stdout


def main() -> int:
    os.environ.setdefault("TAPML_SERVER", "0")  # each command a process of its own, as measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    py = sys.executable
    rows: dict[str, dict[bool, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tapml-crc-") as tmp:
        folder = Path(tmp)
        (folder / "site").mkdir()
        (folder / "site" / "sitecustomize.py").write_text(SITE_OFF)
        cache = folder / "cache"
        size = 0
        for round_ in range(args.repeat):
            for checksums in (True, False):
                env = {**_env(checksums, folder / "site"), "TAPML_CACHE_DIR": str(cache)}
                trace = folder / f"trace_{checksums}.h5"
                wall, _ = _timed([py, "-m", "tapml_dbg", "record", args.model, "-o", str(trace)], env)
                phases = json.loads(_timed([py, "-c", "import json, sys; from tapml_dbg.trace import TraceReader; "
                                            "r = TraceReader(sys.argv[1]); print(json.dumps(r.meta['record_phases']))",
                                            str(trace)], env)[1])
                rows.setdefault("record (wall)", {True: [], False: []})[checksums].append(wall)
                rows.setdefault("record: run phase", {True: [], False: []})[checksums].append(phases["run"])
                size = trace.stat().st_size
                read = json.loads(_timed([py, "-c", READ_ALL, str(folder / "trace_True.h5")], env)[1])
                rows.setdefault("read every tensor once", {True: [], False: []})[checksums].append(read["seconds"])
                if round_ == 0 and checksums:  # warm the compile cache once, so bisects compare reads
                    _timed([py, "-m", "tapml_dbg", "bisect", str(folder / "trace_True.h5"), "--no-sweep", "--json"], env)
                wall, _ = _timed([py, "-m", "tapml_dbg", "bisect", str(folder / "trace_True.h5"), "--no-sweep", "--json"],
                                 env)
                rows.setdefault("bisect --no-sweep (warm cache)", {True: [], False: []})[checksums].append(wall)
                print(f"round {round_ + 1}, checksums {'on' if checksums else 'off'} done", flush=True)
    print(f"\n{Path(args.model).name}: trace {size / 2**20:.0f} MiB, {read['bytes'] / 2**20:.0f} MiB of tensors; "
          f"best of {args.repeat}; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs\n")
    print("| | with checksums | without | cost |")
    print("|---|---:|---:|---:|")
    for name, values in rows.items():
        on, off = min(values[True]), min(values[False])
        print(f"| {name} | {on:.2f} s | {off:.2f} s | {on - off:+.2f} s ({(on / off - 1) * 100:+.0f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
