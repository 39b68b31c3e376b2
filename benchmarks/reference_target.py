"""A trusted TVM target as the reference: what it finds, and what it costs, side by side in one run.

Usage: python benchmarks/reference_target.py [MODEL ...] [--target T] [--reference-target R] [--jobs N]
                                             [--speed] [--out FILE.md]
       MODEL: an example (`selu_mlp`, `tiny_llama`) or a zoo architecture (`llama`, `phi3`); default: a set
       of zoo rows whose CUDA findings docs/coverage.md lists. On a GPU host: `--target cuda`.

For each model, recorded once on torch here: `bisect --target T` against the recorded source, then
`bisect --target T --reference-target R` against the same units on R (default llvm), each a `tapml-dbg`
process of its own, with the first op each names, its verdict and (under R) its attribution, and the
ops where R itself differs from the source (TVM-wide). `--speed` times both bisects with an empty
compile cache (cold) and again (warm), each pair in the same cache state: the reference's values are
computed once per trace and kept, so the warm run reads them.
Then one table, with the machine and the versions. Compare ratios taken in the same run.
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
DEFAULT_MODELS = ("llama", "qwen2", "gpt2", "phi3", "efficientnet", "levit", "falcon_mqa", "roberta", "mpnet",
                  "bert")
TIMEOUT_S = 1500.0


def model_file(name: str) -> tuple[Path, str]:
    """The model's file and the FUNC part of its spec ("" or ":build_llama")."""
    stem, sep, func = name.partition(":")
    for path in (ROOT / "examples" / f"{stem}.py", ROOT / "examples" / "zoo" / f"{stem}.py", Path(stem)):
        if path.is_file():
            return path, f"{sep}{func}"
    raise SystemExit(f"no model {name!r}: give an example, a zoo architecture or a file (FILE[:FUNC])")


def cli(*args: str, cache: Path | None = None, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, TAPML_SERVER="0", **(env or {}))
    if cache is not None:
        env["TAPML_CACHE_DIR"] = str(cache)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tapml_dbg", *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT_S, cwd=ROOT)
    return done, time.perf_counter() - started


def bisect(trace: Path, target: str, reference: str | None, cache: Path | None) -> tuple[dict | str, float]:
    extra = ("--reference-target", reference) if reference else ()
    done, seconds = cli("bisect", str(trace), "--target", target, *extra, "--json", cache=cache)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:160], seconds
    return json.loads(done.stdout), seconds


def culprit_text(result: dict | str) -> str:
    if isinstance(result, str):
        return f"error: {result}"
    op = result.get("op")
    if not op:
        return "no divergence"
    who = f", **{op['attribution']}**" if op.get("attribution") else ""
    return f"#{op['index']} `{op['name']}` (`{op['op']}`) {op['verdict']}{who}"


def wide_text(result: dict | str) -> str:
    if isinstance(result, str):
        return ""
    wide = result.get("tvm_wide") or []
    names = ", ".join(f"#{op['index']} `{op['name']}`" for op in wide[:4])
    return f"{len(wide)}: {names}{' ...' if len(wide) > 4 else ''}" if wide else "0"


def run_model(name: str, work: Path, target: str, reference: str, speed: bool) -> dict:
    trace = work / f"{name.replace(':', '_')}.h5"
    path, func = model_file(name)
    text = path.read_text()
    native = "def build_tvm(" in text and "def build(" not in text  # a TVM-native model: recorded on the reference
    done, record_s = cli("record", f"{path}{func}", "-o", str(trace),
                         *(("--source", f"tvm:{reference}") if native else ()))
    row = {"model": name, "record_s": record_s}
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or ["record failed"])[-1][:160]
        return row
    cold = {}
    if speed:
        for kind, ref in (("source", None), ("reference", reference)):
            cache = Path(tempfile.mkdtemp(prefix=f"cache-{name}-{kind}-", dir=work))
            first, cold_s = bisect(trace, target, ref, cache)
            again, warm_s = bisect(trace, target, ref, cache)
            cold[kind] = (first, cold_s, warm_s)
        row["against_source"], row["source_cold_s"], row["source_warm_s"] = cold["source"]
        row["against_reference"], row["reference_cold_s"], row["reference_warm_s"] = cold["reference"]
    else:
        row["against_source"], row["source_s"] = bisect(trace, target, None, None)
        row["against_reference"], row["reference_s"] = bisect(trace, target, reference, None)
    return row


def versions() -> str:
    import importlib.metadata as metadata

    names = ("apache-tvm", "torch", "transformers", "numpy")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def render(rows: list[dict], target: str, reference: str, speed: bool, seconds: float) -> str:
    lines = [f"`python benchmarks/reference_target.py --target {target} --reference-target {reference}"
             f"{' --speed' if speed else ''}` on {platform.node()} ({os.cpu_count()} CPUs; Python "
             f"{platform.python_version()}, {versions()}), {time.strftime('%Y-%m-%d')}, {seconds:.0f} s in all.", ""]
    if speed:
        lines += [f"| model | against the source ({target}) | against {reference} | TVM-wide | cold: source / "
                  f"reference (ratio) | warm: source / reference (ratio) |", "|---|---|---|---|---|---|"]
    else:
        lines += [f"| model | against the source ({target}) | against {reference} | TVM-wide ({reference} differs "
                  f"from the source) | s (source / reference) |", "|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| `{row['model']}` | record: {row['error']} | | | |")
            continue
        first = [f"`{row['model']}`", culprit_text(row["against_source"]), culprit_text(row["against_reference"]),
                 wide_text(row["against_reference"])]
        if speed:
            cold = row["reference_cold_s"] / row["source_cold_s"]
            warm = row["reference_warm_s"] / row["source_warm_s"]
            first += [f"{row['source_cold_s']:.1f} / {row['reference_cold_s']:.1f} ({cold:.2f}x)",
                      f"{row['source_warm_s']:.1f} / {row['reference_warm_s']:.1f} ({warm:.2f}x)"]
        else:
            first += [f"{row['source_s']:.0f} / {row['reference_s']:.0f}"]
        lines.append("| " + " | ".join(first) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--reference-target", default="llvm")
    parser.add_argument("--jobs", type=int, default=1, help="models at once")
    parser.add_argument("--speed", action="store_true", help="cold and warm times of both bisects, side by side")
    parser.add_argument("--out", default="-", help='markdown file to write ("-": print)')
    args = parser.parse_args(argv)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="reference-target-"))
    rows: list[dict] = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        running = {pool.submit(run_model, name, work, args.target, args.reference_target, args.speed): name
                   for name in args.models}
        for done in concurrent.futures.as_completed(running):
            rows.append(done.result())
            rows.sort(key=lambda row: args.models.index(row["model"]))
            text = render(rows, args.target, args.reference_target, args.speed, time.perf_counter() - started)
            if args.out != "-":  # each finished row written at once: a run cut short keeps what it found
                Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
