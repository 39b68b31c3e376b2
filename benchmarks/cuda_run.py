"""Replay recorded traces on a real CUDA GPU and print what tapml-dbg finds there.

Usage: python benchmarks/cuda_run.py TRACE_DIR [REPORT.md]

TRACE_DIR holds traces recorded on the torch CPU source (mlp, cnn, tiny_gpt2,
fp16_memory_attention, fp16_stats_pool). For each: a codegen check that every op's unit has
device code, a bisect on `cuda` (clean), and for mlp a bisect with a planted 1% fault. The
report is a markdown table (docs/cuda.md holds the H200 run).
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main(trace_dir: Path, report: Path | None) -> int:
    import tvm

    from conftest import fault_transform
    from tapml_dbg.engine.session import Session

    device = tvm.cuda(0)
    if not device.exist:
        print("no CUDA device here")
        return 1
    lines = [f"- device: {device.device_name} (compute {device.compute_version}), tvm {tvm.__version__}, "
             f"python {platform.python_version()}", "",
             "| trace | ops | fault | ops without device code | bisect result | probes | seconds |",
             "|---|---|---|---|---|---|---|"]
    work = Path(tempfile.mkdtemp())
    runs = []
    for trace in sorted(trace_dir.glob("*.h5")):
        runs.append((trace, None))
        if trace.stem == "mlp":
            runs.append((trace, fault_transform(work, "scale", "gelu_1")))
    for trace, transform in runs:
        with Session.open(trace, target="cuda", transform=transform) as session:
            compiled = session.compile_all() if transform is None else None
            started = time.perf_counter()
            result = session.bisect()
            seconds = time.perf_counter() - started
        if result.culprit:
            c = result.culprit
            found = f"#{c.index} {c.name} ({c.op}, {c.layer or '<top>'}): {c.verdict}, {c.summary}"
        else:
            found = "no divergence"
        missing = "-" if compiled is None else str(compiled.failed)
        fault = "scale 1.01 at gelu_1" if transform else "none"
        row = f"| {trace.stem} | {result.ops} | {fault} | {missing} | {found} | {result.probes} | {seconds:.1f} |"
        print(row, flush=True)
        lines.append(row)
        if compiled is not None:
            for failure in compiled.failures[:5]:
                lines.append(f"|  |  |  | {failure['verdict']} #{failure['index']} {failure['name']}: "
                             f"{failure['message'][:80]} |  |  |  |")
    text = "\n".join(lines) + "\n"
    print(text)
    if report:
        report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None))
