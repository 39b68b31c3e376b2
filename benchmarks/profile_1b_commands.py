"""Where `migrate` and `report` spend their time on a large model: examples/llama_1b.py:causal_lm recorded
(shrink it with TAPML_LLAMA_1B_LAYERS / _WIDTH), then `Session.migrate` and `build_report` behind TVM's CUDA
`pow` rewrite (time_to_answer.FIX_POW), each under cProfile, with its progress messages timed.

Usage (from the project's root): TAPML_LLAMA_1B_LAYERS=6 WORK=/tmp/p python benchmarks/profile_1b_commands.py cuda
Prints each command's seconds, a sample of its progress lines and cProfile's top functions (main process).
"""
import cProfile, os, pstats, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.getcwd() + "/benchmarks")
from time_to_answer import FIX_POW
target = sys.argv[1]
work = Path(os.environ.get("WORK", "/tmp/tapml-profile-1b")); work.mkdir(parents=True, exist_ok=True)
fix = work / "fix.py"; fix.write_text(Path("tests/transforms/faults.py").read_text() + FIX_POW)
trace = work / "l.h5"
from tapml_dbg.record.recorder import record
t = time.perf_counter(); record("examples/llama_1b.py:causal_lm", trace); print("record", round(time.perf_counter() - t, 1), flush=True)
from tapml_dbg.engine.session import Session
for what in ("migrate", "report"):
    with Session.open(trace, target=target, transform=f"{fix}:_fix") as s:
        marks = []
        pr = cProfile.Profile(); t = time.perf_counter(); pr.enable()
        if what == "migrate":
            r = s.migrate(progress=lambda *a: marks.append((round(time.perf_counter() - t, 1), str(a[-1])[:50])))
        else:
            from tapml_dbg.engine.report import build_report
            r = build_report(s, progress=lambda *a: marks.append((round(time.perf_counter() - t, 1), str(a[-1])[:50])))
        pr.disable()
        print(what, round(time.perf_counter() - t, 1), "s", flush=True)
        for m in marks[::max(1, len(marks) // 30)]: print("  ", m)
        pstats.Stats(pr).sort_stats("cumtime").print_stats(28)
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
