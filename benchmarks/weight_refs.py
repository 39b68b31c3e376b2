"""Weights by reference (trace v1.4) against weights copied into the trace, side by side in one run.

For each Llama config: random weights saved with `save_pretrained` (safetensors), loaded back with
`from_pretrained`, recorded twice: with the weights referenced (the default) and copied
(`TAPML_WEIGHT_REFS=0`, as before v1.4). Then, on each trace, with the same warm compile cache:
  - the record time and the trace's size (and the checkpoint's),
  - reading every param and every op value once with a fresh reader (what a replay reads; best of READS,
    the two traces alternating, in one process),
  - a clean bisect on llvm (best of REPEATS, the two traces alternating, after one untimed bisect
    fills the compile cache, so both are timed warm).
One table with the machine and versions. Figures are one run on one machine: compare the columns.

Usage: python benchmarks/weight_refs.py [small] [medium] [1b] [--target cuda]   (default: small on llvm)
  small:  2 layers, width 256, vocab 8192  (~27 MB checkpoint, the issue's "small Llama")
  medium: 4 layers, width 512, vocab 16384 (~120 MB)
  1b:     TinyLlama-1.1B-shaped (examples/llama_1b.py's config, 4.4 GB; needs ~40 GB of RAM and disk)
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
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "small": dict(num_hidden_layers=2, hidden_size=256, intermediate_size=704, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=8192),
    "medium": dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                   num_key_value_heads=4, vocab_size=16384),
    "1b": dict(num_hidden_layers=22, hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
}
PROMPT = 16
REPEATS = 2
READS = 5  # read-all is ~0.1-0.2 s: one read of each swings by a third on a shared machine
MODEL_FILE = """import torch
from transformers import LlamaForCausalLM


def build():
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained({checkpoint!r}, attn_implementation="eager").eval()
    return model, (torch.randint(0, {vocab}, (1, {prompt})),)
"""


def main(names: list[str], target: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="tapml-weight-refs-"))
    try:
        rows = [row for name in names for row in bench(name, work / name, target)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, target)


def bench(name: str, folder: Path, target: str) -> list[dict]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tapml_dbg.record.recorder import record

    folder.mkdir(parents=True)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIGS[name], attn_implementation="eager")).save_pretrained(folder / "ckpt")
    checkpoint = sum(f.stat().st_size for f in (folder / "ckpt").glob("*.safetensors"))
    model = folder / "model.py"
    model.write_text(MODEL_FILE.format(checkpoint=str(folder / "ckpt"), vocab=CONFIGS[name]["vocab_size"],
                                       prompt=PROMPT))
    traces = {}
    for _ in range(1 if name == "1b" else REPEATS):  # alternating, best of: the first export warms torch up
        for how, knob in (("referenced", "1"), ("stored", "0")):
            os.environ["TAPML_WEIGHT_REFS"] = knob
            started = time.perf_counter()
            result = record(f"{model}:build", folder / f"{how}.h5")
            seconds = time.perf_counter() - started
            row = traces.setdefault(how, {"config": name, "weights": how, "checkpoint": checkpoint, "ops": result.ops,
                                          "record_s": seconds, "trace": result.file_bytes, "path": folder / f"{how}.h5"})
            row["record_s"] = min(row["record_s"], seconds)
    os.environ.pop("TAPML_WEIGHT_REFS")
    for _ in range(READS):
        for row in traces.values():
            row["read_s"] = min(row.get("read_s", float("inf")), read_everything(row["path"]))
    bisect_times(traces, folder / "cache", target)
    return list(traces.values())


def read_everything(path: Path) -> float:
    """Seconds for a fresh reader to read every param and every op's values once (checksums checked)."""
    from tapml_dbg.trace import TraceReader

    started = time.perf_counter()
    with TraceReader(path) as reader:
        for name in reader.outline.param_names:
            reader.tensors.param(name)
        for index in reader.recorded.finished_ops():
            reader.tensors.op_outputs(index)
    return time.perf_counter() - started


def bisect_times(traces: dict, cache: Path, target: str) -> None:
    from tapml_dbg.engine.session import Session

    def bisect(path: Path) -> float:
        started = time.perf_counter()
        with Session.open(path, cache_dir=cache, target=target) as session:
            result = session.bisect()
        assert not result.diverged, f"{path}: {result.culprit}"
        return time.perf_counter() - started

    bisect(traces["stored"]["path"])  # fills the compile cache: both are then timed warm
    for row in traces.values():
        row["bisect_s"] = []
    for _ in range(REPEATS):
        for row in traces.values():
            row["bisect_s"].append(bisect(row["path"]))
    for row in traces.values():
        row["bisect_s"] = min(row["bisect_s"])


def print_table(rows: list[dict], target: str) -> None:
    import numpy
    import torch
    import transformers
    import tvm

    print(f"machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"versions: python {platform.python_version()}, torch {torch.__version__}, tvm {tvm.__version__}, "
          f"transformers {transformers.__version__}, numpy {numpy.__version__}")
    print(f"prompt {PROMPT} tokens; record: best of {REPEATS} alternating (1b: once each); read all: best of {READS} "
          f"alternating; bisect: clean, on {target}, warm compile cache, best of {REPEATS}")
    print()
    header = ("config", "weights", "checkpoint", "ops", "trace", "trace/ckpt", "record s", "read all s", "bisect s")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print(f"| {row['config']} | {row['weights']} | {mib(row['checkpoint'])} | {row['ops']} | {mib(row['trace'])} | "
              f"{row['trace'] / row['checkpoint']:.2f} | {row['record_s']:.1f} | {row['read_s']:.3f} | "
              f"{row['bisect_s']:.1f} |")


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"


if __name__ == "__main__":
    args = sys.argv[1:]
    on = args[args.index("--target") + 1] if "--target" in args else "llvm"
    main([a for a in args if a in CONFIGS] or ["small"], on)
