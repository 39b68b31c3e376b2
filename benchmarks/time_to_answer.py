"""Time to answer: tapml-dbg's time to the first divergent op against TVM's own time to build the model.

Usage: python benchmarks/time_to_answer.py [MODEL ...] [--target T] [--fix-pow] [--parallel N] [--serve]
       (default models: tiny_llama gpt2_124m cnn; default target llvm; `--target cuda` on a GPU host)

In one run on one machine, for each model:
  - the anchor, in a fresh process: torch.export + `tvm.relax.frontend.torch.from_exported_program`
    (import), `tvm.compile` for the target (compile), one run of `main` on the device (run: on llvm
    it includes the machine-code generation `tvm.compile` defers to the first call);
  - the model recorded once on torch (not timed against the anchor: a trace is recorded once and
    bisected many times), and a 1% fault planted at the op in the middle (tests/transforms/faults.py);
  - tapml-dbg's time to answer, each in a fresh process (imports and worker start-up included, up to
    the answer, where `tapml-dbg bisect` prints it; not the workers' and the interpreter's exit after):
    `Session.bisect` with an empty compile cache (cold), the same again (warm), and after the
    transform changed to also rewrite every op of one kind (changed: the middle op's kind; the values
    stay the same, the units of that kind change), and after the pass file changed so that the fault
    sits at another op (moved: the first plain float op from 3/4 of the model on, issue [17]'s "after a
    transform change"), with what the compile cache built and reused;
  - the same edit made in a live session (the REPL's loop: bisect, edit the pass in place, bisect
    again; the second bisect timed, its units of that kind new ones);
  - with --serve, the moved fault's `tapml-dbg bisect` by the CLI from three copies of the cache the
    fresh process started from: in a process of its own, forked by `tapml-dbg serve` (docs/serve.md),
    and with no setting (the bisect before the edit starts a server as it leaves; the moved one is
    forked from it);
Then one table, with the machine and the versions. Compare ratios taken in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ["tiny_llama", "gpt2_124m", "cnn"]
CHILD_TIMEOUT_S = 3600
MOVED_AT = 0.75  # the moved fault: the first plain float op from here on (a fraction of the ops)

# appended to a copy of faults.py: the planted fault, plus a rewrite of every op of one kind that
# keeps its values (x * 1.0 after the op; x + 0.0 for the live session's edit, so that its units are
# new ones too): what editing a pass that touches one op kind does to units
TOUCH_KIND = '''

TOUCHED_KIND = {kind!r}


def _touched(mod, touch, value):
    @relax.expr_functor.mutator
    class Touch(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value_ = self.visit_expr(binding.value)
            if isinstance(value_, relax.Call) and getattr(value_.op, "name", "") == TOUCHED_KIND:
                inner = self.builder_.emit(value_)
                value_ = touch(inner, relax.const(value, inner.ty.dtype))
            self.set_var_remap(binding.var, self.builder_.emit(value_, binding.var.name))

    return _mutated(Touch, mod)


def _fix(mod):
    return mod


def planted(mod):
    return scale(_fix(mod))


def fault_and_touched_kind(mod):
    return _touched(planted(mod), relax.op.multiply, 1.0)


def fault_and_retouched_kind(mod):
    return _touched(planted(mod), relax.op.add, 0.0)
'''


# appended too with --fix-pow: TVM 0.27's CUDA `pow(x, 2.0)` / `pow(x, 3.0)` is NaN for negative x
# (docs/coverage.md "On CUDA"), the first divergence of GPT-2 and the llama family there; a user's
# fix (x * x, x * x * x) goes first, so that the planted fault is the first divergent op again
FIX_POW = '''


def _fix(mod):
    @relax.expr_functor.mutator
    class Fix(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if getattr(call.op, "name", "") == "relax.power" and isinstance(call.args[1], tvm.ir.expr.Constant):
                exponent = float(call.args[1].value.numpy())
                if exponent in (2.0, 3.0):
                    base = call.args[0]
                    value = relax.op.multiply(base, base)
                    return relax.op.multiply(value, base) if exponent == 3.0 else value
            return call

    return _mutated(Fix, mod)
'''

# the live session's transform: one function whose body the benchmark edits between two bisects
LIVE = '''


def live(mod):
    return {function}(mod)
'''


# ------------------------------------------------------------------------------ child processes
def anchor(model: str, target: str) -> dict:
    """TVM alone: export + import, compile, one run (in this fresh process)."""
    import torch
    from tapml_dbg.frontend.model_loader import load_model

    module, inputs = load_model(str(ROOT / "examples" / f"{model}.py"))
    started = time.perf_counter()
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    tvm_import = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():
        exported = torch.export.export(module, tuple(inputs))
        mod = from_exported_program(exported)
    imported = time.perf_counter() - started
    started = time.perf_counter()
    tvm_target = tvm.target.Target(json.loads(target) if target.startswith("{") else target)
    executable = tvm.compile(mod, tvm_target)
    compiled = time.perf_counter() - started
    device = tvm.device("cpu" if tvm_target.kind.name in ("llvm", "c") else tvm_target.kind.name, 0)
    args = [tvm.runtime.tensor(value.detach().cpu().numpy(), device) for value in inputs]
    started = time.perf_counter()
    vm = relax.VirtualMachine(executable, device)
    vm["main"](*args)
    device.sync()
    ran = time.perf_counter() - started
    return {"tvm import s": tvm_import, "import s": imported, "compile s": compiled, "run s": ran,
            "anchor s": imported + compiled + ran}


def answer(trace: str, target: str, transform: str, cache: str, expected: str, parallel: str = "") -> dict:
    """tapml-dbg's bisect in this fresh process, opened as `tapml-dbg bisect` opens it: session,
    workers, search, sweep, culprit."""
    from tapml_dbg.engine.session import Session

    with Session.open(trace, target=target, transform=transform, cache_dir=cache, start_workers=True,
                      searching=True, parallel=int(parallel) if parallel else None) as session:
        result = session.bisect()
        answered = time.time()  # where `tapml-dbg bisect` prints it (its workers stop after)
        report = session.lanes.cache
        culprit = result.culprit
        found = {"found": bool(culprit and culprit.name == expected), "culprit": culprit.name if culprit else None,
                 "verdict": str(culprit.verdict) if culprit else None, "probes": result.probes,
                 "compiled": report.compiled, "reused": report.reused, "compile lanes": session.lanes.compile_lanes,
                 "search s": result.seconds}
    return found | {"answered at": answered}


def live(trace: str, target: str, transform: str, cache: str, expected: str, edited: str,
         parallel: str = "") -> dict:
    """One session, as the REPL keeps it: a bisect, then the transform's file rewritten with
    `edited` (the pass touched again: units of one kind are new), then the second bisect, timed."""
    from tapml_dbg.engine.session import Session

    with Session.open(trace, target=target, transform=transform, cache_dir=cache, start_workers=True,
                      parallel=int(parallel) if parallel else None) as session:
        first = session.bisect()
        Path(transform.rpartition(":")[0]).write_text(Path(edited).read_text())
        built = session.lanes.cache.compiled
        started = time.perf_counter()
        result = session.bisect()
        seconds = time.perf_counter() - started
        culprit = result.culprit
        return {"found": bool(culprit and culprit.name == expected and first.culprit.name == expected),
                "culprit": culprit.name if culprit else None, "compiled": session.lanes.cache.compiled - built,
                "noticed": any("changed since" in note for note in result.notes), "live s": seconds}


def _child(kind: str, *args: str) -> dict:
    """Run `kind` in a fresh interpreter; its wall time from the process's start to its answer (a
    child that says when it had it: the workers' and the interpreter's exit after that are not
    waited for by a user, who reads the answer; kept as `exit s`)."""
    started, spawned = time.perf_counter(), time.time()
    done = subprocess.run([sys.executable, __file__, "--child", kind, *args], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{kind} {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    data["seconds"] = data["answered at"] - spawned if "answered at" in data else seconds
    data["exit s"] = seconds - data["seconds"]
    return data


def _cli_bisect(trace: Path, target: str, transform: str, expected: str, cache: Path, **env: str) -> dict:
    """`tapml-dbg bisect --json` as a user runs it; its seconds from the start to the answer's line."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "tapml_dbg", "bisect", str(trace), "--target", target,
                                "--transform", transform, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={k: v for k, v in os.environ.items() if k not in ("TAPML_SERVER", "CI")}
                               | {"TAPML_CACHE_DIR": str(cache), **env})  # conftest's import turned it off here
    line = process.stdout.readline()
    answered = time.perf_counter() - started
    _rest, err = process.communicate(timeout=CHILD_TIMEOUT_S)
    if process.returncode != 0 or not line.strip():
        raise SystemExit(f"bisect {transform} failed:\n{err[-4000:]}")
    culprit = (json.loads(line).get("op") or {}).get("name")
    return {"found": culprit == expected, "culprit": culprit, "seconds": answered,
            "exit s": time.perf_counter() - started - answered}


def _moved_by_cli(trace: Path, target: str, transform: str, expected: str, caches: Path, before: str,
                  before_expected: str) -> dict:
    """The moved fault's bisect by the CLI from three copies of the cache the fresh process had: in a
    process of its own (TAPML_SERVER=0); forked by `tapml-dbg serve` (started before, not timed); and
    as a user gets it with no setting (a bisect of the pass `before` the edit, which starts a server
    as it leaves, the time the server took to serve after that answer, then the moved one)."""
    from tapml_dbg.runtime import fork_server

    fresh = _cli_bisect(trace, target, transform, expected, Path(f"{caches}-cli"), TAPML_SERVER="0")
    cache = Path(f"{caches}-served")
    folder = fork_server.server_folder(cache)
    with mock.patch.dict(os.environ, TAPML_CACHE_DIR=str(cache)):  # the server's environment: the command's
        server = fork_server.start(folder, idle_s=None, log=subprocess.DEVNULL)
    try:
        served = _cli_bisect(trace, target, transform, expected, cache)
    finally:
        fork_server.stop(folder)
        server.wait(timeout=60)
    cache = Path(f"{caches}-default")
    folder = fork_server.server_folder(cache)
    try:
        first = _cli_bisect(trace, target, before, before_expected, cache)
        answered = time.perf_counter()
        while fork_server.serving_pid(folder) is None and time.perf_counter() - answered < CHILD_TIMEOUT_S:
            time.sleep(0.05)  # the user edits the pass meanwhile
        first["server serves after s"] = time.perf_counter() - answered
        then = _cli_bisect(trace, target, transform, expected, cache)
    finally:
        fork_server.stop(folder)
    return {"cli": fresh, "served": served, "default first": first, "default": then}


# ------------------------------------------------------------------------------ the run
def run(models: list[str], target: str, fix_pow: bool = False, parallel: int | None = None,
        serve: bool = False) -> None:
    import compileall

    # tapml_dbg byte-compiled first, as pip does at install (torch's and TVM's files are): where
    # PYTHONDONTWRITEBYTECODE is set (these machines set it) every process compiled its sources again
    compileall.compile_dir(str(ROOT / "tapml_dbg"), quiet=1)
    from bisect_bench import middle_op
    from conftest import fault_transform
    from tapml_dbg.engine.session import Session
    from tapml_dbg.record.recorder import record

    work = Path(tempfile.mkdtemp(prefix="tapml-tta-"))
    rows = []
    try:
        for model in models:
            row = {"model": model, **_child("anchor", model, target)}
            print(f"{model} anchor: {json.dumps(row)}", file=sys.stderr, flush=True)
            trace = work / f"{model}.h5"
            started = time.perf_counter()
            recorded = record(str(ROOT / "examples" / f"{model}.py"), trace)
            row["record s"] = time.perf_counter() - started
            with Session.open(trace) as session:
                middle, moved = middle_op(session), middle_op(session, MOVED_AT)
                op = session.by_name[middle]
            row.update(ops=recorded.ops, fault=f"#{op.index} {middle}", kind=op.relax_op,
                       moved_to=f"#{session.by_name[moved].index} {moved}")
            fault = fault_transform(work, "scale", middle)
            tail = TOUCH_KIND.format(kind=op.relax_op) + (FIX_POW if fix_pow else "")
            changed = Path(fault.rpartition(":")[0]).with_name(f"changed_{model}.py")
            text = Path(fault.rpartition(":")[0]).read_text() + tail
            changed.write_text(text)
            moved_file = Path(fault_transform(work, "scale", moved).rpartition(":")[0])
            moved_file.write_text(moved_file.read_text() + tail)
            cache = work / f"cache-{model}"
            shutil.rmtree(cache, ignore_errors=True)
            for phase, file, function, expected in (
                    ("cold", changed, "planted", middle), ("warm", changed, "planted", middle),
                    ("changed", changed, "fault_and_touched_kind", middle), ("moved", moved_file, "planted", moved)):
                if phase == "moved" and serve:  # the same cache as the fresh process's, twice over
                    for copy in ("cli", "served", "default"):
                        shutil.copytree(cache, work / f"cache-{model}-{copy}", symlinks=True)
                row[phase] = _child("answer", str(trace), target, f"{file}:{function}", str(cache), expected,
                                    str(parallel or ""))
                print(f"{model} {phase}: {json.dumps(row[phase])}", file=sys.stderr, flush=True)  # so far
            if serve:
                row["served"] = _moved_by_cli(trace, target, f"{moved_file}:planted", moved, work / f"cache-{model}",
                                              f"{changed}:planted", middle)
                print(f"{model} served: {json.dumps(row['served'])}", file=sys.stderr, flush=True)
            live_file, edited = work / f"live_{model}.py", work / f"edited_{model}.py"
            live_file.write_text(text + LIVE.format(function="planted"))
            edited.write_text(text + LIVE.format(function="fault_and_retouched_kind"))
            row["live"] = _child("live", str(trace), target, f"{live_file}:live", str(cache), middle, str(edited),
                                 str(parallel or ""))
            rows.append(row)
            _print(rows, target, parallel)  # so far, in case a later model fails
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _machine(target: str) -> str:
    import numpy
    import torch
    import tvm

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory = float("nan")
    gpu = ""
    if torch.cuda.is_available():
        gpu = f"; gpu {torch.cuda.get_device_name(0)}"
    return (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB{gpu}; "
            f"{platform.platform()}; python {platform.python_version()}, torch {torch.__version__}, "
            f"tvm {tvm.__version__}, numpy {numpy.__version__}; target {target}; "
            f"load average {tuple(round(x, 1) for x in os.getloadavg())}")


def _print(rows: list[dict], target: str, parallel: int | None = None) -> None:
    print(_machine(target) + f"; run lanes {parallel or 1}")
    print("| model | ops | fault at | anchor: import + compile + run s | bisect cold s (x anchor) | "
          "warm s (x anchor) | changed s (x anchor) | moved to | moved s (x anchor) | "
          "changed, live session s (x anchor) | built cold / changed / moved / live | found |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for row in rows:
        anchor_s = row["anchor s"]
        cold, warm, changed, moved, live_run = (row[phase] for phase in ("cold", "warm", "changed", "moved", "live"))
        wrong = [f"{r['culprit']}" for r in (cold, warm, changed, moved, live_run) if not r["found"]]
        if not live_run["noticed"]:
            wrong.append("the live session did not notice the edit")

        def timed(seconds):
            return f"{seconds:.1f} ({seconds / anchor_s:.2f}x)"

        print(f"| {row['model']} | {row['ops']} | {row['fault']} ({row['kind']}) | "
              f"{row['import s']:.1f} + {row['compile s']:.1f} + {row['run s']:.2f} = {anchor_s:.1f} | "
              f"{timed(cold['seconds'])} | {timed(warm['seconds'])} | {timed(changed['seconds'])} | "
              f"{row['moved_to']} | {timed(moved['seconds'])} | {timed(live_run['live s'])} | "
              f"{cold['compiled']} / {changed['compiled']} / {moved['compiled']} / {live_run['compiled']} | "
              f"{'yes' if not wrong else 'NO: ' + ', '.join(wrong)} ({cold['verdict']}) |")
    exits = [row[phase]["exit s"] for row in rows for phase in ("cold", "warm", "changed", "moved")]
    print(f"(cold, warm, changed, moved: wall seconds of a fresh process each, from its start to the answer, start-up "
          f"included, the exit after it not ({max(exits):.1f} s at most); changed, live "
          f"session: the second bisect of one session, after the pass was edited in place (the REPL's "
          f"edit-and-rerun loop); the TVM import itself, {rows[-1]['tvm import s']:.1f} s in the anchor's "
          "process, is in no column; record s: "
          + ", ".join(f"{r['model']} {r['record s']:.1f}" for r in rows) + ")", flush=True)
    served = [row for row in rows if "served" in row]
    if served:
        print("\n| model | moved to | moved: fresh process (above) s (x anchor) | `tapml-dbg bisect`, a process of its "
              "own s (x) | `tapml-dbg bisect` forked by `tapml-dbg serve` s (x) | no setting: the bisect before the "
              "edit s (x), its server serving after s | no setting: the moved bisect s (x) | found |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        for row in served:
            anchor_s, runs = row["anchor s"], row["served"]
            first = runs["default first"]
            wrong = [r["culprit"] for r in runs.values() if not r["found"]]
            timed = lambda r: f"{r['seconds']:.1f} ({r['seconds'] / anchor_s:.2f}x)"  # noqa: E731
            print(f"| {row['model']} | {row['moved_to']} | {timed(row['moved'])} | {timed(runs['cli'])} | "
                  f"{timed(runs['served'])} | {timed(first)}, {first['server serves after s']:.1f} | "
                  f"{timed(runs['default'])} | {'yes' if not wrong else 'NO: ' + ', '.join(map(str, wrong))} |")
        print("(each from the same copy of the cache the fresh process started from; seconds from the command's "
              "start to its answer's line; no setting: TAPML_SERVER unset, the first command starts the server "
              "the second is forked from)", flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, args = sys.argv[2], sys.argv[3:]
        result = {"anchor": anchor, "answer": answer, "live": live}[kind](*args)
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--fix-pow", action="store_true",
                        help="rewrite pow(x, 2 or 3) as multiplies first (TVM 0.27's CUDA pow is NaN for x < 0)")
    parser.add_argument("--parallel", type=int, help="run lanes, as `tapml-dbg bisect --parallel N` (default 1)")
    parser.add_argument("--serve", action="store_true",
                        help="also the moved fault's `tapml-dbg bisect`, by itself and forked by `tapml-dbg serve`")
    args = parser.parse_args()
    run(args.models, args.target, args.fix_pow, args.parallel, args.serve)


if __name__ == "__main__":
    main()
