"""Recorder and replay performance on real models: time, I/O, size and memory.

Usage: python benchmarks/perf.py [MODEL ...] [--no-replay] [--no-scaling] [--no-window]
       (default models: tiny_llama gpt2_124m cnn)

Every measurement runs in a fresh subprocess, so imports, caches and peak memory of one do not
leak into the next. For each model:

- bare eager forward: a process that only builds the model and calls it: the first (cold)
  forward, the best of 3 warm ones, and the process's peak RSS;
- record: `tapml_dbg.record.record` in its own process: prepare (torch.export + decomposition
  + TVM import + graph serialization) and run (every op, its stats and writes, until the trace
  is closed) phases, total, CPU seconds, peak RSS of the process (getrusage) and of its process
  tree (psutil polling);
- trace write vs raw write: the recorded op tensors written again, op by op and interleaved,
  once through `TraceWriter.write_op` (stats, HDF5, flushes) and once with numpy `tofile` into
  one flat file (flushed per op): the same bytes, in the same run;
- disk floor: the trace file's size written again as one flat file in 16 MiB blocks (`os.write`,
  no fsync, like the recorder), in its own process after the recording: what just moving the
  trace's bytes to this disk costs, with no graph, stats or HDF5;
- replay: the isolated verdict of every op (`Verdicts.isolated_many`) and a bisect to a fault
  planted at the op in the middle, both with an empty compile cache, on tvm llvm, and the peak
  RSS of the replaying process tree;
- with --window (default on for gpt2_124m): the same model recorded with `--window` over one
  transformer block.

A last table records tiny_gpt2 (width 64) with 2 and 24 layers: 12x the ops at nearly the same
parameter bytes, to show that the recorder's memory does not grow with the number of ops.

Figures are from one run on one machine (shared; the load average is printed): compare ratios
taken in the same run, not absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DEFAULT_MODELS = ["tiny_llama", "gpt2_124m", "cnn"]
WINDOWS = {"gpt2_124m": "transformer.h.5", "gpt2_124m_ctx1024": "transformer.h.5"}
POLL_S = 0.05  # psutil sampling period of the process tree's RSS
CHILD_TIMEOUT_S = 3600
DEFAULT_REPEAT = 3  # bare and record runs per model: the machine is shared, so take the best

PRELUDE = f"""
import json, os, resource, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'tests')!r})
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
def _rusage():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {{"maxrss": me.ru_maxrss * 1024, "children_maxrss": kids.ru_maxrss * 1024,
            "cpu": me.ru_utime + me.ru_stime}}
def _emit(data):
    data.update(_rusage())
    print("@@" + json.dumps(data), flush=True)
"""

BARE = PRELUDE + """
t0 = time.perf_counter()
import torch
from tapml_dbg.frontend.model_loader import load_model
torch.manual_seed(0)
module, inputs = load_model(sys.argv[1])
built = time.perf_counter()
with torch.no_grad():
    started, cpu = time.perf_counter(), time.process_time()
    module(*inputs)
    cold, cold_cpu = time.perf_counter() - started, time.process_time() - cpu
    warm, warm_cpu = [], []
    for _ in range(3):
        started, cpu = time.perf_counter(), time.process_time()
        module(*inputs)
        warm.append(time.perf_counter() - started); warm_cpu.append(time.process_time() - cpu)
params = sum(p.numel() * p.element_size() for p in module.parameters())
_emit({"build_s": built - t0, "cold_s": cold, "warm_s": min(warm), "cold_cpu_s": cold_cpu,
       "warm_cpu_s": min(warm_cpu), "param_bytes": params, "process_s": time.perf_counter() - t0 - sum(warm)})
"""

RECORD = PRELUDE + """
import math, threading
import psutil
t0 = time.perf_counter()
import tapml_dbg.record.recorder as recorder
# RSS when the run phase starts (after export and import) and its peak during the run phase,
# sampled by a thread: what the run itself adds, independent of the graph's size
state = {"start": 0, "peak": 0, "on": False}
me = psutil.Process()
def _sample():
    while True:
        if state["on"]:
            state["peak"] = max(state["peak"], me.memory_info().rss)
        time.sleep(0.02)
threading.Thread(target=_sample, daemon=True).start()
_init, _finish = recorder._TraceSink.__init__, recorder._TraceSink.finish
def _start(self, *args, **kwargs):
    state["start"], state["cpu"] = me.memory_info().rss, time.process_time()
    state["peak"], state["on"] = state["start"], True
    _init(self, *args, **kwargs)
def _stop(self):
    writer = _finish(self)
    state["peak"], state["on"] = max(state["peak"], me.memory_info().rss), False
    state["run_cpu"] = time.process_time() - state["cpu"]  # all threads of the process
    return writer
recorder._TraceSink.__init__, recorder._TraceSink.finish = _start, _stop
result = recorder.record(sys.argv[1], sys.argv[2], window=sys.argv[3] or None)
from tapml_dbg.trace import TraceReader
with TraceReader(sys.argv[2]) as reader:
    activations = sum(sum(a.nbytes for a in reader.tensors.op_outputs(i)) for i in reader.recorded.finished_ops())
    stored = reader.tensors.tensor_bytes()
    all_ops = 0
    for op in reader.outline.ops:
        for spec in op.get("outputs", []):
            all_ops += math.prod(spec["shape"]) * {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8,
                                                   "int32": 4, "bool": 1}.get(spec["dtype"], 4)
_emit({"ops": result.ops, "total_s": result.seconds, "prepare_s": result.prepare_seconds,
       "run_s": result.run_seconds, "phases": result.phases, "eager_warm_s": result.eager_seconds,
       "helpers": result.helper_ops, "host_helpers": result.host_helpers, "file_bytes": result.file_bytes,
       "op_tensor_bytes": activations, "tensor_bytes": stored, "activation_bytes": all_ops,
       "stored_ops": result.stored_ops, "process_s": time.perf_counter() - t0,
       "run_start_rss": state["start"], "run_peak_rss": state["peak"], "run_growth_rss": state["peak"] - state["start"],
       "run_cpu_s": state["run_cpu"]})
"""

WRITE = PRELUDE + """
import numpy as np
from tapml_dbg.trace import TraceReader, TraceWriter
source, out_trace, out_raw = sys.argv[1], sys.argv[2], sys.argv[3]
with TraceReader(source) as reader:
    ops = reader.outline.ops
    writer = TraceWriter(out_trace, meta={"model": "rewrite"}, graph_json="{}", tvmscript="",
                         ops=[{"index": op["index"]} for op in ops], inputs={}, params={})
    trace_s = raw_s = 0.0
    total = 0
    with open(out_raw, "wb") as raw:
        for index in reader.recorded.finished_ops():
            values = reader.tensors.op_outputs(index)  # read (not timed), then written both ways
            total += sum(v.nbytes for v in values)
            started = time.perf_counter()
            for value in values:
                np.ascontiguousarray(value).tofile(raw)
            raw.flush()
            raw_s += time.perf_counter() - started
            started = time.perf_counter()
            writer.write_op(index, values)
            trace_s += time.perf_counter() - started
    started = time.perf_counter(); writer.close(); trace_s += time.perf_counter() - started
_emit({"bytes": total, "trace_s": trace_s, "raw_s": raw_s, "trace_file": os.path.getsize(out_trace),
       "raw_file": os.path.getsize(out_raw)})
"""

DISK = PRELUDE + """
size, path = int(sys.argv[1]), sys.argv[2]
block = os.urandom(1 << 20) * 16  # 16 MiB, not zeros (no filesystem can skip them)
started = time.perf_counter()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
written = 0
while written < size:
    written += os.write(fd, block[: min(len(block), size - written)])
os.close(fd)
seconds = time.perf_counter() - started
os.unlink(path)
_emit({"bytes": written, "seconds": seconds})
"""

REPLAY = PRELUDE + """
from conftest import fault_transform
from pathlib import Path
from tapml_dbg.engine.session import Session
trace, cache, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
out = {}
with Session.open(trace, cache_dir=cache + "-sweep") as session:
    capture = session.reader.outline.capture
    first, end = (capture["first"], capture["end"]) if capture else (0, len(session.ops))
    indices = list(range(first, end))
    started = time.perf_counter()
    verdicts = session.verdicts.isolated_many(indices)
    out.update(isolated_s=time.perf_counter() - started, isolated_ops=len(indices), units=session.lanes.units,
               isolated_pass=sum(v.status == "pass" for v in verdicts.values()),
               lanes=session.pool.size)
    middle = next(op for op in session.ops[(first + end) // 2:end]
                  if op.outputs and op.outputs[0].dtype == "float32" and op.relax_op.startswith("relax.")
                  and "reshape" not in op.relax_op and not op.is_tuple)
transform = fault_transform(folder, "scale", middle.name)
with Session.open(trace, transform=transform, cache_dir=cache + "-bisect") as session:
    started = time.perf_counter()
    result = session.bisect()
    out.update(bisect_s=time.perf_counter() - started, probes=result.probes, search_probes=len(result.search),
               found=bool(result.culprit and result.culprit.name == middle.name), fault=middle.name,
               fault_index=middle.index)
_emit(out)
"""

SCALED_MODEL = """
import sys
sys.path.insert(0, {examples!r})
from tiny_gpt2 import build as build_gpt2


def build():
    return build_gpt2(seq=64, n_layer={layers})
"""


def run_child(code: str, *args: str, timeout: float = CHILD_TIMEOUT_S, env: dict | None = None) -> dict:
    """Run `code` in a fresh interpreter; its `@@{json}` line, plus peak RSS of its process tree."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=log,
                            text=True, env=env, cwd=str(ROOT))
    peak, started = 0, time.perf_counter()
    root = psutil.Process(proc.pid)
    import threading

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        if time.perf_counter() - started > timeout:
            proc.kill()
            break
        try:
            tree = [root] + root.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(POLL_S)
    proc.wait()
    reader.join(5)
    result = next((json.loads(line[2:]) for line in lines if line.startswith("@@")), None)
    if result is None:
        log.seek(0)
        raise RuntimeError(f"child failed (exit {proc.returncode}):\n{log.read()[-3000:]}")
    result["tree_peak_rss"] = peak
    result["wall_s"] = time.perf_counter() - started
    return result


def best_of(runs: list[dict]) -> dict:
    """Fewest seconds and most memory over repeated runs of one child (a shared machine is noisy)."""
    best = dict(min(runs, key=lambda run: run.get("run_s", run.get("cold_s", 0.0))))
    for key in runs[0]:
        values = [run[key] for run in runs if isinstance(run.get(key), (int, float))]
        if len(values) != len(runs) or isinstance(runs[0][key], bool):
            continue
        best[key] = max(values) if "rss" in key else min(values)
    best["runs"] = len(runs)
    best["all"] = [{k: run[k] for k in ("cold_s", "warm_s", "run_s", "total_s") if k in run} for run in runs]
    return best


def machine() -> dict:
    import h5py
    import numpy
    import torch
    import tvm

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": f"{memory / 2**30:.0f} GiB",
            "os": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "tvm": tvm.__version__, "numpy": numpy.__version__, "h5py": h5py.__version__,
            "torch threads": torch.get_num_threads(), "load average at start": os.getloadavg()}


def _disk_columns(row: dict) -> str:
    disk = row.get("disk")
    if not disk:
        return "- | - | -"
    floor = disk["seconds"]
    return (f"{floor:.2f} | {floor / row['bare']['cold_s']:.1f}x | "
            f"{row['record']['run_s'] / floor:.1f}x")


def mib(count: float) -> str:
    return f"{count / 2**20:,.0f} MiB" if count >= 2**20 else f"{count / 2**10:,.0f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, metavar="N",
                        help=f"runs of the bare forward and of each recording; best taken (default {DEFAULT_REPEAT})")
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument("--no-scaling", action="store_true")
    parser.add_argument("--no-window", action="store_true")
    parser.add_argument("--baseline", action="store_true",
                        help="also record each model the way the recorder used to: every helper op compiled "
                             "and run on tvm:llvm (empty compile cache) and stats/writes inline")
    parser.add_argument("--json", metavar="FILE", help="also write every raw figure to FILE")
    args = parser.parse_args()

    info = machine()
    work = Path(tempfile.mkdtemp(prefix="tapml-perf-"))
    rows = []
    try:
        for model in args.models:
            spec = str(EXAMPLES / f"{model}.py")
            windows = [None] + ([WINDOWS[model]] if model in WINDOWS and not args.no_window else [])
            bare = best_of([run_child(BARE, spec) for _ in range(args.repeat)])
            print(f"[{model}] bare forward: cold {bare['cold_s']:.2f} s, warm {bare['warm_s']:.3f} s", file=sys.stderr)
            for window in windows:
                name = model if window is None else f"{model} --window {window}"
                trace = work / f"{model}{'-w' if window else ''}.h5"
                rec = best_of([run_child(RECORD, spec, str(trace), window or "") for _ in range(args.repeat)])
                print(f"[{name}] record: {rec['total_s']:.1f} s (run {rec['run_s']:.1f} s)", file=sys.stderr)
                row = {"model": name, "bare": bare, "record": rec,
                       "disk": run_child(DISK, str(rec["file_bytes"]), str(work / "disk.bin"))}
                if window is None:
                    row["write"] = run_child(WRITE, str(trace), str(work / "rewrite.h5"), str(work / "raw.bin"))
                    for leftover in ("rewrite.h5", "raw.bin"):
                        (work / leftover).unlink(missing_ok=True)
                if not args.no_replay:
                    row["replay"] = run_child(REPLAY, str(trace), str(work / f"cache-{model}"), str(work))
                    print(f"[{name}] replay: sweep {row['replay']['isolated_s']:.1f} s, bisect "
                          f"{row['replay']['bisect_s']:.1f} s", file=sys.stderr)
                rows.append(row)
                trace.unlink(missing_ok=True)
            if args.baseline:
                old = {"TAPML_HOST_OPS": "off", "TAPML_WRITE_THREAD": "0", "TAPML_CACHE_DIR": str(work / "cold")}
                rec = run_child(RECORD, spec, str(work / "baseline.h5"), "", env=old)
                rows.append({"model": f"{model} (baseline: helpers on tvm:llvm, cold cache, inline writes)",
                             "bare": bare, "record": rec})
                (work / "baseline.h5").unlink(missing_ok=True)
                shutil.rmtree(work / "cold", ignore_errors=True)
        scaling = []
        if not args.no_scaling:
            for layers in (2, 24):
                spec_file = work / f"gpt2_w64_l{layers}.py"
                spec_file.write_text(SCALED_MODEL.format(examples=str(EXAMPLES), layers=layers))
                bare = best_of([run_child(BARE, str(spec_file)) for _ in range(args.repeat)])
                rec = best_of([run_child(RECORD, str(spec_file), str(work / "scaled.h5"), "")
                               for _ in range(args.repeat)])
                scaling.append({"layers": layers, "bare": bare, "record": rec})
                (work / "scaled.h5").unlink(missing_ok=True)
        info["load average at end"] = os.getloadavg()
        report(info, rows, scaling)
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": info, "rows": rows, "scaling": scaling}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _table_head(header: str, left: int = 1) -> None:
    """A markdown table's header row and its alignment row (`left` columns left-aligned, the rest right)."""
    print(header)
    count = header.count("|") - 1
    print("|" + "|".join(["---"] * left + ["---:"] * (count - left)) + "|")


def report(info: dict, rows: list[dict], scaling: list[dict]) -> None:
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print()
    print("Record time (wall seconds). cold = first forward in a fresh process; warm = best of 3 after it. "
          "prepare = torch.export + decomposition + TVM import + graph serialization; run = every op, its "
          "stats and writes, until the trace is closed. disk floor = the trace file's bytes written as one flat "
          "file in 16 MiB blocks, nothing else (its own process, right after the recording).")
    print()
    _table_head("| model | ops | eager cold | eager warm | record total | prepare | run | run / warm | run / cold | "
          "total / cold | disk floor | floor / cold | run / floor | helpers (host) |")
    for row in rows:
        bare, rec = row["bare"], row["record"]
        print(f"| {row['model']} | {rec['ops']} | {bare['cold_s']:.2f} | {bare['warm_s']:.3f} | {rec['total_s']:.1f} "
              f"| {rec['prepare_s']:.1f} | {rec['run_s']:.2f} | {rec['run_s'] / bare['warm_s']:.1f}x | "
              f"{rec['run_s'] / bare['cold_s']:.1f}x | {rec['total_s'] / bare['cold_s']:.1f}x | "
              f"{_disk_columns(row)} | {rec['helpers']} ({rec['host_helpers']}) |")
    print()
    print("The same in CPU seconds (user + system, all threads; less sensitive to other users of the machine "
          "than wall time, but counts torch's 2 intra-op threads and the writer thread in full).")
    print()
    _table_head("| model | eager cold CPU | eager warm CPU | record process CPU | run CPU | run CPU / warm CPU | "
          "run CPU / cold CPU |")
    for row in rows:
        bare, rec = row["bare"], row["record"]
        print(f"| {row['model']} | {bare['cold_cpu_s']:.2f} | {bare['warm_cpu_s']:.3f} | {rec['cpu']:.1f} | "
              f"{rec['run_cpu_s']:.2f} | {rec['run_cpu_s'] / max(bare['warm_cpu_s'], 1e-9):.1f}x | "
              f"{rec['run_cpu_s'] / max(bare['cold_cpu_s'], 1e-9):.1f}x |")
    print()
    print("Trace size and write throughput. raw activations = every op's outputs at their dtypes; trace write = "
          "TraceWriter.write_op (stats + HDF5 + flushes) of the recorded op tensors; raw write = numpy tofile of "
          "the same bytes, interleaved op by op in the same run.")
    print()
    _table_head("| model | raw activations | op tensors stored | params + inputs | trace file | file / stored tensors | "
          "trace write | raw write | trace / raw |")
    for row in rows:
        rec, write = row["record"], row.get("write")
        params = rec["tensor_bytes"] - rec["op_tensor_bytes"]
        if write:
            trace_rate, raw_rate = write["bytes"] / write["trace_s"] / 1e9, write["bytes"] / write["raw_s"] / 1e9
            rates = f"{trace_rate:.2f} GB/s | {raw_rate:.2f} GB/s | {trace_rate / raw_rate:.2f}"
        else:
            rates = "- | - | -"
        print(f"| {row['model']} | {mib(rec['activation_bytes'])} | {mib(rec['op_tensor_bytes'])} | {mib(params)} | "
              f"{mib(rec['file_bytes'])} | {rec['file_bytes'] / max(rec['tensor_bytes'], 1):.3f} | {rates} |")
    print()
    print("Peak RSS. process = getrusage maxrss of the one process; tree = psutil-sampled sum over the process "
          "and its children (replay runs its units in worker processes).")
    print()
    _table_head("| model | trace file | bare forward | record (process) | record / bare | run-phase growth | "
          "replay (tree) | replay / trace file |")
    for row in rows:
        bare, rec, replay = row["bare"], row["record"], row.get("replay")
        replay_text = f"{mib(replay['tree_peak_rss'])} | {replay['tree_peak_rss'] / rec['file_bytes']:.2f}" \
            if replay else "- | -"
        print(f"| {row['model']} | {mib(rec['file_bytes'])} | {mib(bare['maxrss'])} | {mib(rec['maxrss'])} | "
              f"{rec['maxrss'] / bare['maxrss']:.2f}x | {mib(rec['run_growth_rss'])} | "
              f"{replay_text} |")
    if any(row.get("replay") for row in rows):
        print()
        print("Replay on tvm llvm, empty compile cache. isolated = every op's isolated verdict (batched units over "
              "the session's lanes); bisect = a 1% fault planted at the middle op, found by prefix probes + "
              "isolated confirmation + isolated sweep.")
        print()
        _table_head("| model | ops searched | isolated verdicts (s) | units | all pass | bisect (s) | probes | "
              "prefix probes | log2(ops) + 1 | found |")
        for row in rows:
            replay = row.get("replay")
            if not replay:
                continue
            n = replay["isolated_ops"]
            print(f"| {row['model']} | {n} | {replay['isolated_s']:.1f} | {replay['units']} | "
                  f"{replay['isolated_pass']}/{n} | {replay['bisect_s']:.1f} | {replay['probes']} | "
                  f"{replay['search_probes']} | {math.ceil(math.log2(max(n, 2))) + 1} | "
                  f"{'yes' if replay['found'] else 'NO'} (#{replay['fault_index']} {replay['fault']}) |")
    if scaling:
        print()
        print("Memory vs number of ops: tiny_gpt2 (width 64, seq 64) with 2 and 24 layers.")
        print()
        _table_head("| layers | ops | params | bare forward peak RSS | record peak RSS | RSS at run start | "
              "run-phase peak RSS | run-phase growth |", left=0)
        for item in scaling:
            rec, bare = item["record"], item["bare"]
            print(f"| {item['layers']} | {rec['ops']} | {mib(bare['param_bytes'])} | {mib(bare['maxrss'])} | "
                  f"{mib(rec['maxrss'])} | {mib(rec['run_start_rss'])} | {mib(rec['run_peak_rss'])} | "
                  f"{mib(rec['run_growth_rss'])} |")


if __name__ == "__main__":
    main()
