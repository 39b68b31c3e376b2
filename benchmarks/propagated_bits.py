"""One implementation of propagated values ([14]): the same ops' target values, fed the target's own
upstream values, asked for four ways in one session, compared bit for bit, each way timed.

The four ways: the REPL's `step` (one op at a time from op 0, both verdicts each), the report's
series (`engine/propagation.py:TargetChains.series`), bisect's chain (`engine/chain.py:ChainSearch`,
run to the end on a clean model) and `run --offload all` (a mixed run with every op on the target).
tests/test_propagated_values.py runs this on llvm; on a GPU (`--target cuda`) a fused unit's
kernels are scheduled otherwise than a per-op chain's, so one implementation is what keeps them equal.

Usage:
  python benchmarks/propagated_bits.py                               # tiny_llama on llvm
  python benchmarks/propagated_bits.py --model gpt2_124m --target cuda
  python benchmarks/propagated_bits.py --trace traces/gpt2.h5 --target cuda
Figures are from one run on one machine: compare the ratio, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WAYS = ("step", "report", "bisect chain", "run --offload all")


def same_bits(left, right) -> bool:
    """Equal dtype, shape and bytes, output by output."""
    if left is None or right is None or len(left) != len(right):
        return False
    for a, b in zip(left, right):
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            return False
    return True


def picked_ops(session) -> list[int]:
    """Three ops with values: a third of the way, two thirds, and the last."""
    judged = [op.index for op in session.ops if op.outputs]
    return sorted({judged[len(judged) // 3], judged[2 * len(judged) // 3], judged[-1]})


def four_ways(session, picks: list[int]) -> tuple[dict[str, dict[str, list]], dict[str, float]]:
    """way -> op name -> its target value, and way -> seconds, for ops `picks` of a clean model."""
    from tapml_dbg.engine.chain import ChainSearch
    from tapml_dbg.engine.stops import Debugger

    last, names = picks[-1], {session.ops[i].name for i in picks}
    values: dict[str, dict[str, list]] = {}
    seconds: dict[str, float] = {}

    started = time.perf_counter()
    Debugger(session).step(last + 1)
    values["step"] = {name: session.replay.values.get(name) for name in names}
    seconds["step"] = time.perf_counter() - started
    print(f"step: {seconds['step']:.1f} s", file=sys.stderr, flush=True)

    started = time.perf_counter()
    values["report"] = {session.ops[i].name: found for i, _run, found in session.chains.series(last=last)
                        if i in picks}
    seconds["report"] = time.perf_counter() - started
    print(f"report: {seconds['report']:.1f} s", file=sys.stderr, flush=True)

    started = time.perf_counter()
    search = ChainSearch(session, 0, last, session.verdicts.unscreened(), also_keep=names)
    finding = search.run()
    while finding.index is not None and not finding.lost:  # a real divergence (CUDA's pow): go on past it
        print(f"the chain found #{finding.index}: accepted, on to the end", file=sys.stderr, flush=True)
        search.accept.add(session.ops[finding.index].name)
        finding = search.run()
    if finding.lost:
        raise SystemExit(f"the chain did not come back: {finding.message}")
    values["bisect chain"] = {name: finding.kept.get(name) for name in names}
    seconds["bisect chain"] = time.perf_counter() - started
    print(f"bisect chain: {seconds['bisect chain']:.1f} s", file=sys.stderr, flush=True)

    started = time.perf_counter()
    mixed = session.mixed_runner.run(range(len(session.ops)), keep_values=True)
    if mixed.failure:
        raise SystemExit(f"run --offload all failed: {mixed.failure}")
    values["run --offload all"] = {name: mixed.values.get(name) for name in names}
    seconds["run --offload all"] = time.perf_counter() - started
    return values, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny_llama", help="an example name (tiny_llama, gpt2_124m, ...)")
    parser.add_argument("--trace", help="a recorded trace to reuse instead of recording --model")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--work", help="folder for the trace and the cache (default: a temporary one)")
    args = parser.parse_args()
    from tapml_dbg.engine.session import Session
    from tapml_dbg.record.recorder import record

    work = Path(args.work or tempfile.mkdtemp(prefix="tapml-propagated-bits-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = Path(args.trace) if args.trace else work / f"{args.model}.h5"
    if not trace.exists():
        record(str(ROOT / "examples" / f"{args.model}.py"), trace)
    print(f"recorded {trace}", file=sys.stderr, flush=True)
    with Session.open(trace, target=args.target, cache_dir=work / "cache") as session:
        picks = picked_ops(session)
        values, seconds = four_ways(session, picks)
    import platform

    import tvm

    print(f"machine: {platform.machine()}, tvm {tvm.__version__}, target {args.target}, trace {trace.name}")
    print(f"  {'op':<28} " + "  ".join(f"{way:>18}" for way in WAYS[1:]) + "   (bit-equal to step's)")
    equal = True
    for index in picks:
        name = session.ops[index].name
        row = [same_bits(values["step"][name], values[way][name]) for way in WAYS[1:]]
        equal &= all(row)
        print(f"  #{index} {name:<24} " + "  ".join(f"{str(ok):>18}" for ok in row))
    print("  seconds: " + ", ".join(f"{way} {seconds[way]:.2f}" for way in WAYS))
    print("one value per op" if equal else "VALUES DIFFER")
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
