"""A TVM-native LLM's generation against the PyTorch generation of the same weights, side by side in one run.

Usage: python benchmarks/native_llm.py [--steps N] [--target T] [--out FILE.md]
       (default: 4 decode steps, llvm; on a GPU host `--target cuda` bisects on CUDA)

examples/native_llama.py holds one tiny Llama twice: transformers' (`build`) and the same weights in
`relax.frontend.nn` on TVM's paged KV cache (`build_tvm`). Both generations are recorded here with
`--generate N` (the transformers one on torch, the native one on tvm:llvm), then each is bisected on
the target, clean and with a 5% fault planted in the last decode step's last attention call (the
native `attention_with_fused_qkv` call; in the transformers graph, the attention's output projection
of that step), each bisect a `tapml-dbg` process of its own with an empty compile cache (cold) and
again (warm). Then one table, with the machine and the versions. Compare ratios taken in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from reference_target import cli, versions  # a sibling script: `python benchmarks/native_llm.py` puts it on the path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "native_llama.py"
FAULTS = ROOT / "tests" / "transforms" / "faults.py"
PAGED = "vm.builtin.attention_kv_cache_attention_with_fused_qkv"


def record(spec: str, out: Path, steps: int, *extra: str) -> float:
    done, seconds = cli("record", spec, "-o", str(out), "--generate", str(steps), *extra)
    if done.returncode != 0:
        raise SystemExit(f"record {spec}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return seconds


def fault_op(trace: Path, steps: int) -> str:
    """The op a fault is planted at: the last step's last paged-attention call (native), or the last
    step's last attention output projection (transformers)."""
    done, _ = cli("info", str(trace), "--json")
    ops = [op for op in json.loads(done.stdout)["ops"] if op.get("step") == steps]
    paged = [op for op in ops if op["op"] == PAGED]
    if paged:
        return paged[-1]["name"]
    return [op for op in ops if op["layer"].endswith("self_attn.o_proj")][-1]["name"]


def bisect(trace: Path, target: str, cache: Path, fault: str | None) -> tuple[str, float]:
    extra = ("--transform", f"{FAULTS}:scale") if fault else ()
    env = {"TAPML_FAULT_OP": fault, "TAPML_FAULT_SCALE": "1.05"} if fault else None
    done, seconds = cli("bisect", str(trace), "--target", target, "--json", *extra, cache=cache, env=env)
    if done.returncode not in (0, 1):
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:120], seconds
    report = json.loads(done.stdout)
    if not report["diverged"]:
        return f"clean ({report['ops']} ops)", seconds
    op = report["op"]
    return f"#{op['index']} {op['name']} step {op.get('step')} ({op['verdict']})", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="native-llm-bench-") as tmp:
        work = Path(tmp)
        for label, spec, extra in (("transformers on torch", f"{EXAMPLE}:build", ()),
                                   ("relax.frontend.nn on tvm:llvm", str(EXAMPLE), ("--source", "tvm:llvm"))):
            trace = work / f"{len(rows)}.h5"
            row = {"model": label, "record_s": record(spec, trace, args.steps, *extra)}
            fault = fault_op(trace, args.steps)
            for kind, planted in (("clean", None), ("fault", fault)):
                cache = work / f"cache{len(rows)}{kind}"
                row[f"{kind}_cold"] = bisect(trace, args.target, cache, planted)
                row[f"{kind}_warm"] = bisect(trace, args.target, cache, planted)
            done, _ = cli("info", str(trace), "--json")
            row["ops"] = json.loads(done.stdout)["num_ops"]
            rows.append(row)
            print(f"{label}: {row}", file=sys.stderr)
    lines = [f"`python benchmarks/native_llm.py --steps {args.steps} --target {args.target}` on {platform.node()} "
             f"({os.cpu_count()} CPUs; Python {platform.python_version()}, {versions()}), {time.strftime('%Y-%m-%d')}, "
             f"{time.perf_counter() - started:.0f} s in all.", "",
             "| generation of examples/native_llama.py | ops | record s | bisect clean: cold / warm s | "
             "bisect, 5% fault in the last step's attention: named | cold / warm s |", "|---|---|---|---|---|---|"]
    base = rows[0]
    for row in rows:
        ratio = row["clean_cold"][1] / base["clean_cold"][1]
        lines.append(f"| {row['model']} | {row['ops']} | {row['record_s']:.0f} | {row['clean_cold'][1]:.1f} / "
                     f"{row['clean_warm'][1]:.1f} ({ratio:.2f}x cold) | {row['fault_cold'][0]} | "
                     f"{row['fault_cold'][1]:.1f} / {row['fault_warm'][1]:.1f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
