"""Minimize the README's real fp16 findings on a target and print the smallest failing shapes.

Usage: python benchmarks/minimize_findings.py [--target llvm|cuda|...] [--work DIR]

For each fp16 example: record it (torch CPU source), bisect it on the target, then
`dump --op CULPRIT --minimize` and run the repro in a fresh interpreter. Prints one markdown
table (docs/dump-example.md holds the llvm run): the culprit, the recorded and the smallest failing
shapes, candidates tried, seconds, the repro's size and exit status. Works on a GPU machine with
`--target cuda` (run there by the lead: the findings on CUDA differ, e.g. `var_p0`).
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
EXAMPLES = ("fp16_memory_attention", "fp16_stats_pool", "fp16_wide_projection")
TIMEOUT_S = 1800


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tapml_dbg", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def one(example: str, target: str, work: Path) -> str:
    trace = work / f"{example}.h5"
    if not trace.exists():
        recorded = cli("record", str(ROOT / "examples" / f"{example}.py"), "-o", str(trace))
        if recorded.returncode:
            return f"| {example} | record failed: {recorded.stderr.strip().splitlines()[-1]} | | | | | |"
    found = cli("bisect", str(trace), "--target", target, "--json")
    if found.returncode:
        return f"| {example} | bisect failed: {found.stderr.strip().splitlines()[-1]} | | | | | |"
    culprit = json.loads(found.stdout)["op"]
    if culprit is None:
        return f"| {example} | no divergence on {target} | | | | | |"
    folder = work / f"{example}-{target}-min"
    started = time.perf_counter()
    dumped = cli("dump", str(trace), "--op", str(culprit["index"]), "-o", str(folder), "--target", target,
                 "--minimize")
    seconds = time.perf_counter() - started
    if dumped.returncode:
        return f"| {example} #{culprit['index']} {culprit['name']} | dump failed: {dumped.stderr.strip()} | | | | | |"
    meta = json.loads((folder / "meta.json").read_text())
    shrunk = meta["minimized"]
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    run = subprocess.run([sys.executable, str(folder / "repro.py")], cwd=work, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    shapes = lambda key: " x ".join(str(tuple(s)) for s in shrunk[key])  # noqa: E731
    return (f"| {example} #{culprit['index']} `{culprit['name']}` ({culprit['verdict']}) | {shapes('from')} | "
            f"{shapes('to')}{'' if shrunk['minimized'] else ' (' + shrunk['note'] + ')'} | {shrunk['probes']} | "
            f"{seconds:.0f} | {size / 1024:.1f} KiB | {run.returncode} |")


def main(argv=None) -> int:
    os.environ.setdefault("TAPML_SERVER", "0")  # each command a process of its own, as measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--work", type=Path, default=None, help="folder for traces and repros (default: a temp dir)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tapml-minimize-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"target {args.target}; traces and repros in {work}\n")
    print("| finding | recorded shapes | smallest failing shapes | candidates | seconds | repro | repro exit |")
    print("|---|---|---|---|---|---|---|")
    for example in EXAMPLES:
        print(one(example, args.target, work), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
