"""LLMs on a GPU, end to end through the CLI: generation traces and a 1.1B Llama on CUDA.

Runs each command as a user would (`python -m tapml_dbg ...`, a fresh process each), prints one line
per command (wall seconds, peak RSS of the process, exit code, the answer's first lines) and writes
every command's full output under OUT (default: $OUT, else a temporary folder).

Parts:
  generation  examples/plain_qwen2.py --generate 3: bisect on the target as it is; `fix`; bisect with
              the fix (the tokens should then be the source's); the fix plus a fault planted in one
              decode step's softmax (bisect must name that (step, op)); and
              examples/gpt2_fp16_long_context.py --generate 4 triaged on the target
  1b          examples/llama_1b.py:causal_lm recorded (peak RSS), bisected and triaged on the target
  1b-behind   the same recorded, then bisected with TVM's CUDA `pow` NaN rewritten away (x * x) and with
              that rewrite plus a 1% fault planted at the middle op: a fault found behind a real bug
  1b-scale    the same recorded (under --trace-dir, default the temporary folder), then, with the `pow`
              rewrite, `migrate`, `report` and `triage` on the target, each stopped after --limit seconds
              (issue [17]'s "1B-class models work end to end"); `--keep-trace` leaves the trace for a
              later call on the same machine
Usage: python benchmarks/llm_cuda.py [generation] [1b] [--target cuda] [--out DIR]
Check a script on the CPU first: `--target llvm` with TAPML_LLAMA_1B_LAYERS=2 TAPML_LLAMA_1B_WIDTH=256.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FAULTS = ROOT / "tests" / "transforms" / "faults.py"
COMMAND_TIMEOUT_S = 3000

BOTH = '''"""The fix `tapml-dbg fix` wrote, then a fault planted at one op (a fault behind a real bug)."""
import importlib.util


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_fix = _load({fix!r}, "tapml_fix").fix
_fault = _load({fault!r}, "tapml_fault")
_fault.SETTINGS.update({settings!r})


def both(mod):
    return _fault.scale(_fix(mod))
'''


def _wait_with_peak(process: subprocess.Popen, limit: float) -> tuple[int | str, int]:
    """The command's exit code ("stopped" past `limit` seconds) and the peak RSS in KiB of its largest
    process, its workers included (they are reaped inside its tree): `wait4` reports one child's tree,
    where RUSAGE_CHILDREN would report the largest of every command so far."""
    deadline = time.monotonic() + limit
    stopped = False
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return ("stopped" if stopped else process.returncode), usage.ru_maxrss
        if not stopped and time.monotonic() > deadline:
            process.kill()
            stopped = True
        time.sleep(0.1)


class Runner:
    """Runs CLI commands, one fresh process each, and keeps what they printed and their peak RSS."""

    def __init__(self, out: Path):
        self.out = out
        self.rows: list[dict] = []

    def cli(self, label: str, *args: str, json_out: bool = False, limit: float = COMMAND_TIMEOUT_S) -> dict | str:
        started = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            process = subprocess.Popen([sys.executable, "-m", "tapml_dbg", *args], stdout=out, stderr=err, text=True,
                                       cwd=ROOT)
            rc, peak = _wait_with_peak(process, limit)
            out.seek(0), err.seek(0)
            result = subprocess.CompletedProcess(process.args, rc, out.read(),
                                                 err.read() + (f"stopped after {limit:.0f} s" if rc == "stopped" else ""))
        seconds = time.perf_counter() - started
        (self.out / f"{label}.out").write_text(result.stdout + "\n--- stderr\n" + result.stderr)
        head = (result.stdout.strip().splitlines() or result.stderr.strip().splitlines() or [""])
        row = {"label": label, "seconds": round(seconds, 1), "rc": result.returncode,
               "peak_rss_gib": round(peak / 2**20, 2),
               "head": head[0][:200] if not json_out else ""}
        self.rows.append(row)
        print(f"{label:<34} rc={row['rc']} {row['seconds']:>7.1f} s  rss {row['peak_rss_gib']} GiB  {row['head']}",
              flush=True)
        if json_out and result.returncode == 0:
            try:
                return json.loads(result.stdout)
            except json.JSONDecodeError:
                return {}
        return result.stdout


def generation(run: Runner, target: str) -> None:
    trace = run.out / "qwen2_gen3.h5"
    run.cli("record qwen2 --generate 3", "record", str(EXAMPLES / "plain_qwen2.py"), "-o", str(trace),
            "--generate", "3")
    found = run.cli("bisect qwen2 gen", "bisect", str(trace), "--target", target, "--json", json_out=True)
    _say(found)
    fixed = run.cli("fix qwen2 gen", "fix", str(trace), "-o", str(run.out / "fix_qwen2"), "--target", target,
                    "--json", json_out=True)
    print("  fix:", json.dumps({k: fixed.get(k) for k in ("fixed", "output_passed")})[:400] if fixed else "-")
    fix_file = run.out / "fix_qwen2" / "fix.py"
    if not fix_file.exists():
        return
    _say(run.cli("bisect qwen2 gen + fix", "bisect", str(trace), "--target", target, "--transform",
                 f"{fix_file}:fix", "--json", json_out=True))
    info = json.loads(subprocess.run([sys.executable, "-m", "tapml_dbg", "info", str(trace), "--json"],
                                     capture_output=True, text=True, cwd=ROOT).stdout)
    softmax = [op for op in info["ops"] if op["step"] == 2 and op["op"] == "aten._softmax.default"][1]
    both = run.out / "fix_and_fault.py"
    both.write_text(BOTH.format(fix=str(fix_file), fault=str(FAULTS), settings={"op": softmax["name"]}))
    found = run.cli("bisect gen + fix + step-2 fault", "bisect", str(trace), "--target", target, "--transform",
                    f"{both}:both", "--json", json_out=True)
    _say(found)
    print(f"  planted at #{softmax['index']} {softmax['name']} (step 2): found "
          f"{(found.get('op') or {}).get('index')} step {(found.get('op') or {}).get('step')}")
    long = run.out / "gpt2_long.h5"
    run.cli("record gpt2 fp16 long --generate 4", "record", str(EXAMPLES / "gpt2_fp16_long_context.py"), "-o",
            str(long), "--generate", "4")
    triaged = run.cli("triage gpt2 fp16 long", "triage", str(long), "--target", target, "--json", json_out=True)
    for group in (triaged or {}).get("groups", []):
        print(f"  cause {group['cause']} [{group['class']}]: "
              + ", ".join(f"#{op['index']} {op['name']} step {op.get('step')}" for op in group["ops"][:8]))


def one_b(run: Runner, target: str) -> None:
    trace = run.out / "llama_1b.h5"
    run.cli("record llama 1.1B", "record", f"{EXAMPLES / 'llama_1b.py'}:causal_lm", "-o", str(trace))
    print("  trace", round(trace.stat().st_size / 2**30, 2) if trace.exists() else None, "GiB")
    _say(run.cli("bisect llama 1.1B", "bisect", str(trace), "--target", target, "--json", json_out=True))
    triaged = run.cli("triage llama 1.1B", "triage", str(trace), "--target", target, "--json", json_out=True)
    for group in (triaged or {}).get("groups", []):
        print(f"  cause {group['cause']} [{group['class']}]: {len(group['ops'])} ops, first "
              f"#{group['ops'][0]['index']} {group['ops'][0]['name']}")
    trace.unlink(missing_ok=True)  # 10+ GB: not carried back


def one_b_behind(run: Runner, target: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    from bisect_bench import middle_op
    from time_to_answer import FIX_POW
    from tapml_dbg.engine.session import Session

    trace = run.out / "llama_1b.h5"
    run.cli("record llama 1.1B", "record", f"{EXAMPLES / 'llama_1b.py'}:causal_lm", "-o", str(trace))
    with Session.open(trace) as session:
        middle = session.by_name[middle_op(session)]
    fixed = run.out / "fix_pow.py"
    fixed.write_text(FAULTS.read_text() + FIX_POW + PLANTED.format(op=middle.name))
    _say(run.cli("bisect 1.1B, pow fixed", "bisect", str(trace), "--target", target, "--transform",
                 f"{fixed}:_fix", "--json", json_out=True))
    found = run.cli("bisect 1.1B, pow fixed + fault", "bisect", str(trace), "--target", target, "--transform",
                    f"{fixed}:fixed_and_planted", "--json", json_out=True)
    _say(found)
    print(f"  planted at #{middle.index} {middle.name}: found #{(found.get('op') or {}).get('index')}")
    trace.unlink(missing_ok=True)


SCALE_COMMANDS = ("migrate", "report", "triage")


def one_b_scale(run: Runner, target: str, trace_dir: Path, limit: float, keep_trace: bool,
                commands: tuple[str, ...] = SCALE_COMMANDS) -> None:
    """The 1.1B model through the commands a user runs after bisect (`commands` of them), behind the
    `pow` rewrite."""
    from time_to_answer import FIX_POW

    trace = trace_dir / "llama_1b.h5"
    if not trace.exists():
        run.cli("record llama 1.1B", "record", f"{EXAMPLES / 'llama_1b.py'}:causal_lm", "-o", str(trace))
    fixed = run.out / "fix_pow_only.py"
    fixed.write_text(FAULTS.read_text() + FIX_POW)
    fix = ["--target", target, "--transform", f"{fixed}:_fix"]
    if "migrate" in commands:
        migrated = run.cli("migrate 1.1B, pow fixed", "migrate", str(trace), *fix, "--json", json_out=True, limit=limit)
        if isinstance(migrated, dict) and migrated:
            print("  migrate:", json.dumps({k: migrated.get(k) for k in ("first_failing_step", "seconds")}),
                  len(migrated.get("steps", [])), "steps")
    if "report" in commands:
        run.cli("report 1.1B, pow fixed", "report", str(trace), "-o", str(run.out / "report_1b"), *fix, limit=limit)
    if "triage" in commands:
        triaged = run.cli("triage 1.1B, pow fixed", "triage", str(trace), *fix, "--json", json_out=True, limit=limit)
        for group in (triaged or {}).get("groups", []) if isinstance(triaged, dict) else []:
            print(f"  cause {group['cause']} [{group['class']}]: {len(group['ops'])} ops")
    if not keep_trace:
        trace.unlink(missing_ok=True)


PLANTED = '''


def fixed_and_planted(mod):
    SETTINGS["op"] = {op!r}
    return scale(_fix(mod))
'''


def _say(found) -> None:
    if not isinstance(found, dict) or not found:
        print("  (no JSON)")
        return
    op = found.get("op") or {}
    print(f"  op: {op.get('index')} {op.get('name')} {op.get('op')} step {op.get('step')} "
          f"verdict {op.get('verdict')} class {op.get('class')}; first_bad_token {found.get('first_bad_token')}")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TAPML_SERVER", "0")  # each command a process of its own, as measured
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parts", nargs="*", default=["generation", "1b"],
                        choices=["generation", "1b", "1b-behind", "1b-scale"])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--trace-dir", help="where 1b-scale keeps its 10 GB trace (default: a temporary folder)")
    parser.add_argument("--limit", type=float, default=COMMAND_TIMEOUT_S, help="1b-scale: seconds per command")
    parser.add_argument("--keep-trace", action="store_true", help="1b-scale: leave the trace for a later call")
    parser.add_argument("--commands", default=",".join(SCALE_COMMANDS),
                        help="1b-scale: which of migrate,report,triage to run (comma-separated)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tapml-llm-cuda-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, target {args.target}, "
          f"out {out}", flush=True)
    run = Runner(out)
    trace_dir = Path(args.trace_dir or tempfile.mkdtemp(prefix="tapml-1b-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        if part == "1b-scale":
            one_b_scale(run, args.target, trace_dir, args.limit, args.keep_trace,
                        tuple(c.strip() for c in args.commands.split(",") if c.strip()))
        else:
            {"generation": generation, "1b": one_b, "1b-behind": one_b_behind}[part](run, args.target)
    (out / "rows.json").write_text(json.dumps(run.rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
