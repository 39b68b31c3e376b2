"""transformers causal-LM families in float32, float16 and bfloat16, forward and generation: what bisect finds.

Usage: python benchmarks/family_coverage.py [--families F ...] [--dtypes fp32 fp16 bf16] [--generate N]
                                            [--target T] [--jobs N] [--out FILE.md]

For each family of examples/family_lms.py (tiny configs, random seeded weights) and each dtype, one cell
records the model's forward (`tapml-dbg record FILE:build_FAMILY_DTYPE`) and its greedy generation
(`--generate N`, default 2), then bisects each trace (`bisect --target T --json`, default llvm), each a
`tapml-dbg` process of its own. A cell is clean, the first divergent op (index, name, aten op, verdict,
class; generation: its step and the first bad token), or the one-line error of a record or bisect that
failed. Then one markdown table, with the machine and the versions (docs/coverage.md, "Causal-LM families
by dtype on llvm").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "family_lms.py"
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi", "gpt2", "llama_wide")
DTYPES = ("fp32", "fp16", "bf16")
TIMEOUT_S = 1200.0
ERROR_CHARS = 160


def cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """One `tapml-dbg` process (no server: the code in this checkout answers)."""
    env = dict(os.environ, TAPML_SERVER="0")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tapml_dbg", *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT_S, cwd=ROOT)
    return done, time.perf_counter() - started


def last_line(done: subprocess.CompletedProcess, fallback: str) -> str:
    return (done.stderr.strip().splitlines() or [fallback])[-1][:ERROR_CHARS]


def culprit(op: dict) -> dict:
    """The parts of bisect's `op` object a table cell shows."""
    ratio = (op.get("metrics") or {}).get("ratio")
    return {"index": op["index"], "name": op["name"], "op": op["op"], "layer": op.get("layer"),
            "verdict": op["verdict"], "class": op.get("class"), "step": op.get("step"), "ratio": ratio,
            "message": short_message(op.get("message") or "")}


def short_message(message: str) -> str:
    """A compile error's reason: TVM's `Check failed: (...) is false: REASON` keeps only REASON."""
    lines = message.strip().splitlines()
    first = lines[0] if lines else ""
    return first.rpartition(" is false: ")[2][:ERROR_CHARS]


def run_cell(family: str, dtype: str, generate: int, work: Path, target: str = "llvm") -> dict:
    """Record one family in one dtype (forward, or `--generate N` when N > 0) and bisect it on `target`.

    Returns {"family", "dtype", "generate", "status": "clean" | "diverged" | "record error" | "bisect error",
    "ops", "op" (culprit() or None), "first_bad_token" (None or bisect's object), "tokens" (steps the
    target's top-1 matched, steps, KL max; generation only), "error", "record_s", "bisect_s"}.
    """
    trace = Path(work) / f"{family}_{dtype}{f'_gen{generate}' if generate else ''}.h5"
    cell = {"family": family, "dtype": dtype, "generate": generate, "status": "", "ops": None, "op": None,
            "first_bad_token": None, "tokens": None, "error": "", "record_s": 0.0, "bisect_s": 0.0}
    extra = ("--generate", str(generate)) if generate else ()
    done, cell["record_s"] = cli("record", f"{MODELS}:build_{family}_{dtype}", "-o", str(trace), *extra)
    if done.returncode != 0:
        return dict(cell, status="record error", error=last_line(done, "record failed"))
    done, cell["bisect_s"] = cli("bisect", str(trace), "--target", target, "--json")
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return dict(cell, status="bisect error", error=last_line(done, "bisect failed"))
    cell["ops"] = result["ops"]
    cell["first_bad_token"] = result.get("first_bad_token")
    steps = (result.get("tokens") or {}).get("steps") or []
    if steps:
        cell["tokens"] = {"same": sum(step["verdict"] == "same" for step in steps), "steps": len(steps),
                          "kl_max": max(step["kl"] for step in steps)}
    if result.get("op"):
        return dict(cell, status="diverged", op=culprit(result["op"]))
    return dict(cell, status="diverged" if result["diverged"] else "clean")


def cell_text(cell: dict) -> str:
    if cell["status"] in ("record error", "bisect error"):
        return f"{cell['status']}: {cell['error']}"
    tokens = cell["tokens"]
    said = f"; tokens {tokens['same']}/{tokens['steps']} the source's, KL max {tokens['kl_max']:.1e}" if tokens else ""
    op = cell["op"]
    if op is None:
        return f"{cell['status']} ({cell['ops']} ops){said}"
    where = ", ".join(part for part in (f"`{op['op']}`", f"`{op['layer']}`" if op["layer"] else "",
                                        f"step {op['step']}" if op["step"] is not None else "") if part)
    ratio = f", {op['ratio']:.1f}x the source's error" if op["ratio"] else ""
    kind = f", {op['class']}" if op["class"] else ""
    message = f": {op['message']}" if op["message"] else ""
    return f"**#{op['index']} `{op['name']}`** ({where}) {op['verdict']}{kind}{ratio}{message}{said}"


def token_text(cell: dict) -> str:
    first = cell["first_bad_token"]
    if cell["status"] in ("record error", "bisect error"):
        return ""
    if first is None:
        return "none"
    return (f"step {first['step']} (position {first['position']}): {first['target']} for {first['source']}"
            f"{', in the top-k' if first['in_top_k'] else ', not in the top-k'}")


def versions() -> str:
    import importlib.metadata as metadata

    found = []
    for name in ("apache-tvm", "torch", "transformers", "numpy"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def render(cells: dict, order: list[tuple[str, str]], generate: int, command: str, seconds: float) -> str:
    lines = [f"`python benchmarks/family_coverage.py {command}` on {platform.node()} "
             f"({os.cpu_count()} CPUs, {platform.machine()}; Python {platform.python_version()}, {versions()}), "
             f"{time.strftime('%Y-%m-%d')}, {seconds / 60:.1f} min in all.", "",
             f"| family | dtype | forward | `--generate {generate}` | first bad token | s |", "|---|---|---|---|---|---:|"]
    for family, dtype in order:
        forward, generation = cells.get((family, dtype, 0)), cells.get((family, dtype, generate))
        if forward is None and generation is None:
            continue
        seconds = sum(cell["record_s"] + cell["bisect_s"] for cell in (forward, generation) if cell)
        lines.append(f"| {family} | {dtype} | {cell_text(forward) if forward else ''} | "
                     f"{cell_text(generation) if generation else ''} | {token_text(generation) if generation else ''}"
                     f" | {seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--generate", type=int, default=2, help="decode steps of the generation cells")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--jobs", type=int, default=1, help="cells at once (1 or 2 on a 2-core machine)")
    parser.add_argument("--out", default="-", help='markdown file to write ("-": print)')
    parser.add_argument("--json", help="also write every cell's result to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="family-coverage-"))
    order = [(family, dtype) for family in args.families for dtype in args.dtypes]
    cells: dict = {}
    text = ""
    command = " ".join(sys.argv[1:] if argv is None else argv)  # as run, so the table says how to get it again
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        running = [pool.submit(run_cell, family, dtype, steps, work, args.target)
                   for family, dtype in order for steps in (0, args.generate)]
        for done in concurrent.futures.as_completed(running):
            cell = done.result()
            cells[(cell["family"], cell["dtype"], cell["generate"])] = cell
            text = render(cells, order, args.generate, command, time.perf_counter() - started)
            if args.out != "-":  # each finished cell written at once: a run cut short keeps what it found
                Path(args.out).write_text(text)
            if args.json:
                Path(args.json).write_text(json.dumps(list(cells.values()), indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
