"""Coverage of the model zoo: does every architecture import, record, replay clean and bisect?

Usage:
    python benchmarks/coverage.py                     # every zoo architecture -> docs/coverage.md
    python benchmarks/coverage.py bert vit resnet     # some of them (the table lists only those)
    python benchmarks/coverage.py --fast              # skip the slow ones (gpt2_124m)
    python benchmarks/coverage.py --behind roberta    # past a real bug: its fix (or kept ops), then the fault
    options: --out FILE.md (default docs/coverage.md; "-" prints it), --timeout S per architecture
             (default 600), --target T (default llvm), --jobs N (architectures at once, default 1),
             --keep DIR (keep traces and logs there), --rows DIR (each row's JSON there, as it is
             written), --behind

For each architecture of `examples/zoo/registry.py`, in its own subprocess (so that a crash or
a hang inside torch or TVM costs one row, not the table), four columns, each pass or fail with
a one-line reason:

- import:  `torch.export` + core-ATen decomposition + TVM import of `examples/zoo/<name>.py`.
- record:  `record()` (what `tapml-dbg record` runs) writes a complete trace.
- clean:   `Session.bisect()` on the target with no fault. It probes the whole model and, when
           nothing diverges, sweeps every op's isolated verdict, so a pass means every op's
           isolated verdict passed AND the model's propagated output passed; it is then
           cross-checked by asking `Session.isolated(i)` of every op (served from the sweep).
- fault:   a `scale` fault (x1.01) planted with `tests/conftest.py: fault_transform` at a float32
           op in the middle of the model; pass when `bisect()` names exactly that op, isolated.

With `--behind`, a row whose clean stage found a real divergence goes on past it with the tool's own
mechanisms (docs/fix.md, docs/keep.md) before the fault stage, instead of stopping there:

- behind:  `fix` (triage, then a verified rewrite per cause: `tapml-dbg fix TRACE -o DIR`) writes
           `fix.py`; every cause it does not fix is kept on the source (`--keep`); then `bisect()`
           with the fix and the kept ops, and any culprit it still names is kept too (at most
           `BEHIND_ROUNDS` rounds), until nothing diverges. The row records the rewrites and kept ops.
- fault:   then planted at a float32 op in the middle of the model *after the first real bug*, the
           transform being the fix followed by the fault (`engine.fix.composed_text`, as
           `fix_then_transform.py`), the same ops kept: pass when `bisect()` names exactly that op.

The child writes its row as JSON after every stage, so a row killed mid-way still says which
stage it died in.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO_DIR = ROOT / "examples" / "zoo"
DEFAULT_OUT = ROOT / "docs" / "coverage.md"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_TARGET = "llvm"
FAULT_KIND = "scale"
FAULT_SCALE = "1.01"
STAGES = ("import", "record", "clean", "fault")
BEHIND = "behind"  # the optional stage between clean and fault (--behind)
BEHIND_ROUNDS = 4  # bisects with the fix and kept ops, each keeping the culprit it still names
REASON_CHARS = 240  # one short line per cell
PYTHON = sys.executable  # what runs each architecture's child (the test suite's: forked from its fork server)

for folder in (ROOT, ROOT / "tests", ZOO_DIR):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


# ======================================================================== one architecture (child)
def run_one(name: str, work: Path, target: str = DEFAULT_TARGET, report=lambda row: None,
            behind: bool = False) -> dict:
    """All four stages for one zoo architecture; `report(row)` is called after each stage. With
    `behind`, a clean stage that finds a real divergence is followed by the behind stage (the fix or
    kept ops that get past it) and the fault stage runs with them."""
    from registry import ZOO

    entry = ZOO[name]
    spec = str(ZOO_DIR / f"{name}.py")
    row = {"name": name, "family": entry.family, "ops": None, "seconds": 0.0,
           **{stage: {"status": "skipped", "reason": "", "seconds": 0.0} for stage in STAGES}}
    started = time.perf_counter()
    trace = work / f"{name}.h5"
    cache = work / f"cache-{name}"
    state: dict = {}

    stages = [("import", lambda: _stage_import(spec, row)),
              ("record", lambda: _stage_record(spec, trace, row)),
              ("clean", lambda: _stage_clean(trace, target, cache, state)),
              (BEHIND, lambda: _stage_behind(trace, target, cache, work, state, row)),
              ("fault", lambda: _stage_fault(trace, target, cache, work, state))]
    failed = None
    for stage, run in stages:
        if stage == BEHIND:  # only past a real divergence the clean stage found, when asked
            if not (behind and failed == "clean" and "first_bug" in state):
                continue
        elif failed is not None and not (stage == "fault" and failed == "clean" and BEHIND in row
                                         and row[BEHIND]["status"] == "pass"):
            break
        row[stage] = {"status": "running", "reason": "", "seconds": 0.0}
        report(row)
        stage_started = time.perf_counter()
        try:
            ok, reason = run()
        except Exception as exc:  # any failure is a finding for this row, never the end of the table
            ok, reason = False, f"{type(exc).__name__}: {_first_line(exc)}"
        row[stage] = {**row.get(stage, {}), "status": "pass" if ok else "fail", "reason": _short(reason),
                      "seconds": round(time.perf_counter() - stage_started, 2)}
        row["seconds"] = round(time.perf_counter() - started, 2)
        report(row)
        if not ok:
            failed = failed or stage
            if stage != "clean":
                break
    return row


def _stage_import(spec: str, row: dict) -> tuple[bool, str]:
    import torch

    from tapml_dbg.frontend.importer import export_program, import_program
    from tapml_dbg.frontend.model_loader import load_model
    from tapml_dbg.record.recorder import DEFAULT_SEED

    torch.manual_seed(DEFAULT_SEED)
    module, inputs = load_model(spec)
    with torch.no_grad():
        program = export_program(module, inputs)
    graph, _ = import_program(program)
    row["ops"] = len(graph.ops)
    params = sum(p.numel() for p in module.parameters())
    row["params"] = params
    shapes = ", ".join("x".join(map(str, t.shape)) for t in inputs)
    return True, f"{params / 1e6:.2f}M params, inputs {shapes}"


def _stage_record(spec: str, trace: Path, row: dict) -> tuple[bool, str]:
    from tapml_dbg.record.recorder import record
    from tapml_dbg.trace import TraceReader

    result = record(spec, trace)
    row["ops"] = result.ops
    with TraceReader(trace) as reader:
        finished, complete = len(reader.recorded.finished_ops()), reader.complete
        diff = reader.meta.get("eager_output_max_abs_diff")
    if finished != result.ops or not complete:
        return False, f"only {finished} of {result.ops} ops recorded (complete: {complete})"
    text = f"{result.file_bytes / 2**20:.1f} MiB, {result.helper_ops} helper ops"
    if diff is not None:
        text += f", output vs eager {diff:.1e}"
    return True, text


def _stage_clean(trace: Path, target: str, cache: Path, state: dict) -> tuple[bool, str]:
    from tapml_dbg.engine.session import Session

    with Session.open(trace, target=target, cache_dir=cache) as session:
        result = session.bisect()
        if result.diverged:
            culprit = result.culprit
            state["first_bug"] = culprit.index
            return False, (f"#{culprit.index} {culprit.name} ({culprit.op}) {culprit.verdict}: "
                           f"{culprit.summary}")
        verdicts = [session.isolated(op.index) for op in session.ops if op.outputs]
        failing = [v for v in verdicts if v.failed]  # an undefined value ([8]) is not a failure
        if failing:
            first = failing[0]
            state["first_bug"] = first.index
            return False, f"#{first.index} {first.name} isolated {first.status}: {first.summary}"
        state["fault_op"] = _fault_op(session)  # verdicts come from the sweep's cache: no extra compile
        notes = f" ({'; '.join(result.notes)})" if result.notes else ""
        return True, f"{len(verdicts)} isolated verdicts + model output pass, {result.probes} probes{notes}"


def _fault_op(session, after: int = -1, avoid=frozenset()) -> str | None:
    """A float32 op in the middle of the model whose scaled value must differ: finite, non-zero.
    `after`: only ops after this index (behind a real bug: the middle of the ops after it when the
    bug lies past the middle); `avoid`: op names the fault must not sit at (kept or rewritten ops)."""
    ops = [op for op in session.ops if op.index > after and op.index not in session.kept
           and op.name not in avoid]
    middle = len(session.ops) // 2
    start = next((i for i, op in enumerate(ops) if op.index >= middle), len(ops)) if middle > after \
        else len(ops) // 2
    for op in ops[start:] + ops[:start]:
        if not (op.relax_op.startswith("relax.") and op.outputs and not op.is_tuple
                and op.outputs[0].dtype == "float32" and "reshape" not in op.relax_op):
            continue
        stats = session.reader.tensors.op_stats(op.index)[0]
        if stats.get("nan") or stats.get("inf") or not stats.get("absmax"):
            continue
        if not session.isolated(op.index).passed:
            continue
        return op.name
    return None


def _stage_behind(trace: Path, target: str, cache: Path, work: Path, state: dict, row: dict) -> tuple[bool, str]:
    """Past the real bug the clean stage found: `fix` for every cause triage lists, every cause it
    does not fix kept on the source, then bisect with both until nothing diverges (each culprit still
    named is kept too). Sets state's fix transform, kept ops and fault op; the row says what it applied."""
    from tapml_dbg.engine.fix import fix
    from tapml_dbg.engine.kept import kept_selector, kept_text
    from tapml_dbg.engine.session import Session

    first_bug = state["first_bug"]
    folder = work / "fix"
    info: dict = {"first_bug": first_bug, "fixed": [], "unfixed": [], "kept": [], "rounds": 0}
    row[BEHIND] = {**row.get(BEHIND, {}), **info}
    with Session.open(trace, target=target, cache_dir=cache) as session:
        fixed = fix(session, folder)
    rewritten = fixed.rewritten
    info["fixed"] = [f"#{op.index} {op.name}: {op.kind}" for op in rewritten]
    info["unfixed"] = [f"#{op.index} {op.name}: {op.why}" for op in fixed.unfixed]
    info["fix_output"] = fixed.output_after.text() if fixed.output_after else ""
    transform = f"{folder / 'fix.py'}:fix" if rewritten else None
    kept: set[int] = {op.index for op in fixed.unfixed}
    notes = []
    for round_ in range(1, BEHIND_ROUNDS + 1):
        info["rounds"] = round_
        with Session.open(trace, target=target, cache_dir=cache, transform=transform) as session:
            if kept:
                kept = set(session.set_kept(sorted(kept)))
            result = session.bisect()
            if not result.diverged:
                info["kept"] = sorted(kept)
                # behind the first real bug got past: the first op rewritten or kept (the clean stage's
                # culprit may be an error of the moment, such as a device out of memory)
                passed_bugs = [op.index for op in rewritten] + sorted(kept)
                info["first_bug"] = min(passed_bugs) if passed_bugs else first_bug
                state["fault_op"] = _fault_op(session, after=info["first_bug"], avoid={r.name for r in rewritten})
                kept_names = kept_text(session.ops, kept) if kept else ""
                break
            culprit = result.culprit
            fixed_here = any(op.index == culprit.index for op in rewritten)
            notes.append(f"#{culprit.index} {culprit.name} ({culprit.verdict}"
                         + (f", {culprit.wrong}" if culprit.wrong else "")
                         + (", named again under its fix" if fixed_here else "") + ")")
            kept.add(culprit.index)
    else:
        info["kept"] = sorted(kept)
        row[BEHIND].update(info)
        return False, (f"still diverges after {BEHIND_ROUNDS} rounds (kept in turn: {', '.join(notes)}); fix: "
                       f"{', '.join(info['fixed']) or 'none'}")
    state["fix"] = transform
    state["kept"] = sorted(kept)
    applied = []
    if rewritten:
        kinds = sorted({op.kind for op in rewritten})
        applied.append(f"fix {'/'.join(kinds)} at {len(rewritten)} op(s) ({_op_list(rewritten)})")
    info["bisect_kept"] = notes
    row[BEHIND].update(info)
    if kept:
        why = []
        if fixed.unfixed:
            why.append("not fixed: " + ", ".join(f"#{op.index}" for op in fixed.unfixed))
        if notes:
            why.append("still named by bisect: " + ", ".join(notes))
        applied.append(f"kept {kept_names} (--keep {kept_selector(kept)}; {'; '.join(why)})")
    return True, "; ".join(applied) + f"; then bisect clean ({fixed.sessions} fix session(s))"


def _op_list(ops, shown: int = 3) -> str:
    names = [f"#{op.index} {op.name}" for op in ops[:shown]]
    return ", ".join(names) + (f", +{len(ops) - shown}" if len(ops) > shown else "")


def _stage_fault(trace: Path, target: str, cache: Path, work: Path, state: dict) -> tuple[bool, str]:
    from conftest import fault_transform
    from tapml_dbg.engine.fix import composed_text
    from tapml_dbg.engine.session import Session

    op = state.get("fault_op")
    if op is None:
        return False, "no finite, non-zero float32 op to plant a fault in"
    transform = fault_transform(work, FAULT_KIND, op, scale=FAULT_SCALE)
    if state.get("fix"):  # behind a real bug: the fix, then the fault, as a pass list would run them
        composed = work / "fix_then_fault.py"
        composed.write_text(composed_text(state["fix"].rsplit(":", 1)[0], transform))
        transform = f"{composed}:fix"
    with Session.open(trace, target=target, cache_dir=cache, transform=transform) as session:
        if state.get("kept"):
            session.set_kept(state["kept"])
        index = session.by_name[op].index
        result = session.bisect()
        culprit = result.culprit
        if culprit is None:
            return False, f"planted at #{index} {op}: nothing found"
        found = f"#{culprit.index} {culprit.name} ({culprit.op}) {culprit.verdict}"
        if culprit.name != op or culprit.verdict != "isolated":
            return False, f"planted at #{index} {op}, found {found}: {culprit.summary}"
        return True, f"found {found}, {result.probes} probes"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _short(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


# ======================================================================== the table (parent)
def run_all(names: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, target: str = DEFAULT_TARGET,
            work: Path | None = None, jobs: int = 1, progress=lambda row: None, behind: bool = False) -> list[dict]:
    """Each architecture in a subprocess with a time limit, `jobs` at a time; one row each, in order."""
    from concurrent.futures import ThreadPoolExecutor

    own_work = work is None
    work = Path(work or tempfile.mkdtemp(prefix="tapml-coverage-"))
    work.mkdir(parents=True, exist_ok=True)

    def one(name):
        row = _run_child(name, work, timeout_s, target, behind)
        if own_work:  # traces of real-size models are large: free each as soon as its row is done
            shutil.rmtree(work / name, ignore_errors=True)
        progress(row)
        return row

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, names))
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)


def _run_child(name: str, work: Path, timeout_s: float, target: str, behind: bool = False) -> dict:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    row_path, log_path = folder / "row.json", folder / "log.txt"
    started = time.perf_counter()
    command = [PYTHON, str(Path(__file__).resolve()), "--one", name, "--row", str(row_path),
               "--work", str(folder), "--target", target] + (["--behind"] if behind else [])
    with open(log_path, "w") as log:
        # a session of its own: on a timeout the whole group (TVM workers included) is stopped
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 cwd=str(ROOT))
        try:
            code = child.wait(timeout=timeout_s)
            outcome = None if code == 0 else _exit_text(code)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            outcome = f"timeout: no result within {timeout_s:.0f} s"
    row = _read_row(row_path, name)
    if outcome:  # the stage it was in when it died gets the reason
        order = (*STAGES[:3], BEHIND, STAGES[3])
        stage = next((s for s in order if row.get(s, {}).get("status") == "running"), None)
        if stage is None:
            stage = next((s for s in STAGES if row[s]["status"] == "skipped"), STAGES[-1])
        tail = _log_tail(log_path)
        row[stage] = {"status": "fail", "reason": _short(outcome + (f" ({tail})" if tail else "")),
                      "seconds": row[stage].get("seconds", 0.0)}
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"crash: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"crash: killed by signal {-code}"
    return f"crash: exit status {code}"


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)  # the group this child leads, which we started
    except ProcessLookupError:
        pass
    child.wait()


def _read_row(path: Path, name: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        from registry import ZOO

        family = ZOO[name].family if name in ZOO else "?"
        return {"name": name, "family": family, "ops": None, "seconds": 0.0,
                **{stage: {"status": "skipped", "reason": "", "seconds": 0.0} for stage in STAGES}}


def _log_tail(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "Error" in line or "error" in line or "Check failed" in line]
    return (errors or lines or [""])[-1]


def passed(row: dict) -> bool:
    return all(row[stage]["status"] == "pass" for stage in STAGES)


# ======================================================================== markdown
HEADER = """# Model zoo coverage

Generated by `python benchmarks/coverage.py` (do not edit by hand: run it again). Each row is one
`transformers` architecture of `examples/zoo/` (tiny configs plus the real GPT-2 small config,
random weights, nothing downloaded),
run in its own subprocess with a {timeout:.0f} s limit. Columns:

- **import**: `torch.export` + core-ATen decomposition + TVM {tvm} import (`from_exported_program`).
- **record**: `tapml-dbg record` writes a complete trace (torch eager source).
- **clean {target}**: `bisect` with no fault finds nothing: every op's *isolated* verdict passes
  (fed recorded inputs) and the whole model's *propagated* output passes, under the default
  noise-floor rule (docs/tolerance.md); an op whose import changed its type fails (a type verdict).
- **fault bisect**: a x{scale} `scale` fault planted at a float32 op in the middle of the model
  (`tests/conftest.py: fault_transform`) is found by `bisect`: exactly that op, isolated verdict.
- **s**: wall seconds for the row (all four stages; compile cache cold).
"""

# What was found behind each expected failure (shown only while the row fails)
KNOWN_CAUSES = {
    "falcon_mqa": "TVM limitation 1 below (negative index read out of bounds)",
    "convbert": "TVM limitation 2 below (`unfold` → `aten.index.Tensor` import)",
    # a type verdict ([8]): RoBERTa-style position ids are a cumsum of the int32 mask
    "roberta": "TVM limitation 4 below (an integer `cumsum` keeps int32; torch gives int64)",
    "xlm_roberta": "TVM limitation 4 below (an integer `cumsum` keeps int32; torch gives int64)",
    "mpnet": "TVM limitation 4 below (an integer `cumsum` keeps int32; torch gives int64)",
}

LIMITATIONS = """## Known TVM 0.27 limitations

Each one with the failing aten op and a minimal repro (a `build()` file for `tapml-dbg record`, or
a `tapml-dbg dump` command). Where a model config avoids it, the zoo does so and says which.

1. **`aten.index.Tensor` with a negative index is read out of bounds** (`falcon_mqa`). The
   converter imports `x[..., [-2], :]` as `R.take(x, [-2], mode="fast")`, which does not wrap
   negative indices as torch does: the op reads memory before the tensor (garbage, different
   on every run; it may also crash).
   ```python
   class M(torch.nn.Module):
       def forward(self, x):          # x: (4, 6)
           return x[:, [-1]]          # torch: the last column; TVM 0.27: out of bounds
   ```
   `tapml-dbg bisect` names op `index` (isolated); for the model, `tapml-dbg record
   examples/zoo/falcon_mqa.py -o f.h5 && tapml-dbg dump f.h5 --op index_1 -o DIR` writes a repro
   that needs only `tvm` + `numpy`. Falcon's multi-query layout (`multi_query=True`, Falcon-7B)
   and its new decoder architecture (Falcon-40B) split q/k/v this way; the `falcon` row uses
   `multi_query=False` (integer selects) and passes.
2. **`aten.index.Tensor` with sliced leading dims and multi-dim index tensors fails to import**
   (`convbert`: `nn.functional.unfold`, im2col, decomposes to `x[:, :, i, j]` with `i` of shape
   (9, 16, 1, 1) and `j` of shape (1, 1)). The converter broadcasts an `arange` for each `:` against
   the index tensors instead of keeping the sliced dims in front:
   ```python
   class M(torch.nn.Module):
       def forward(self, x):          # x: (1, 32, 16, 1)
           return torch.nn.functional.unfold(x, kernel_size=(9, 1), padding=(4, 0))
   ```
   `TVM import of aten.index.Tensor ... index_tensor: cannot broadcast index shapes. Mismatch at
   axis 0: T.int64(32) vs T.int64(9)`. No ConvBERT config avoids `unfold`. Since issue 49 the two
   `index` nodes run on the host (docs/host-only-ops.md): `convbert` records (253 ops, 2 on the
   host) and bisects clean on llvm (measured 2026-12-07, 2-core machine; the table predates it).
3. **`aten.amax` has no converter** (e.g. `torch.amax`, `torch.logsumexp`):
   ```python
   class M(torch.nn.Module):
       def forward(self, x):          # x: (4, 8)
           return torch.logsumexp(x, dim=-1)
   ```
   `TVM 0.27 has no converter for aten.amax`: since issue 49 such an op records and runs on the host
   in every replay, listed as a finding (docs/host-only-ops.md); so do the mixture-of-experts layers'
   `aten.histc` and transformers' `grouped_mm_fallback` custom op (tiny Mixtral and Qwen2-MoE
   bisect clean on llvm with them on the host, and a fault planted after them is found at its op:
   tests/test_host_only_ops.py), and a node whose converter raises when the host can run it (their
   int64 `div(..., rounding_mode="floor")` by a Python int: TVM 0.27 imports an int32 constant).
4. **`cumsum` over a bool tensor keeps dtype bool**: torch promotes to int64; TVM imports a bool
   `cumsum` that then fails to compile (`Check failed: (t.MatchesCode(DLDataTypeCode::kDLFloat))`,
   a `compile-error` verdict). HF text models build positions or masks this way when no
   attention mask is given.
   ```python
   class M(torch.nn.Module):
       def forward(self, x):          # x: (2, 8)
           return (x > 0).cumsum(-1)
   ```
   Workaround (every text model of the zoo): pass an explicit int64 `attention_mask`.
   The same converter keeps an int32 `cumsum` int32 (torch: int64): the values agree until they
   pass 2^31, but the import changed the type, a type verdict (`roberta`, `xlm_roberta`, `mpnet`:
   position ids are `mask.int().cumsum(1)`); `tapml-dbg bisect` names `cumsum`, class `type`.
5. **`group_norm` without affine parameters fails to import** (any dtype):
   `torch.nn.GroupNorm(4, 16, affine=False)` on a (1, 16, 64) input gives `TVM import of
   aten.native_group_norm.default ... Check failed: (n.defined()) is false: Found null pointer
   node`. (The fp16 group_norm import failure reported earlier did not reproduce with affine
   parameters on this stack: `GroupNorm(4, 16).half()` imports and replays clean on llvm. The zoo's
   audio encoders use affine group norms and record in fp32.)
6. **fp16 `softmax` / `mean` / `var` over ~4096 elements diverge on llvm**: the legalized
   reductions accumulate in fp16 (softmax rows of 32768 sum to about 2.5). Repro:
   `tapml-dbg record examples/fp16_memory_attention.py -o t.h5 && tapml-dbg bisect t.h5`
   (`_softmax`), `examples/fp16_stats_pool.py` (`mean`); `tapml-dbg dump t.h5 --op _softmax -o DIR`.
   The zoo records in fp32.
7. **`max_pool2d_with_indices` imports the indices as zeros** (values are right). tapml-dbg
   ignores a tuple field nothing reads (ResNet, RegNet, the examples' CNN use only the values) and
   reports it when a model reads the indices:
   ```python
   class M(torch.nn.Module):
       def forward(self, x):          # x: (1, 2, 4, 4)
           return torch.nn.functional.max_pool2d(x, 2, return_indices=True)[1]
   ```
8. **fp16 `matmul` sums in fp16 on llvm** (torch sums in fp32 and rounds once): 3% off over
   k=16384, 2% at k=4096. `tapml-dbg record examples/fp16_wide_projection.py -o t.h5 &&
   tapml-dbg bisect t.h5` names `addmm_1_p0` (the matmul inside the down projection's `addmm`);
   `tapml-dbg dump t.h5 --op addmm_1_p0 -o DIR` writes the repro. The zoo records in fp32.
9. **`pow(x, 3.0)` on CUDA is NaN for negative x** (GPT-2's `gelu_new`): not on llvm, so not in
   this table; see `docs/cuda.md` (`tapml-dbg bisect gpt2.h5 --target cuda` names `pow_1`).
10. **bf16 on llvm** (`tests/test_bf16.py`, docs/coverage.md's "bf16 on llvm"): (a) `matmul` sums
   bf16 in bf16: each step `acc + a * b` is computed in float32 and rounded to bf16 (torch sums
   in float32 and rounds once), 3.8% of the output's scale at k=512, 10% at k=4864 (random
   normal operands); (b) `relax.nn.layer_norm` does not build in bf16 (`layer_norm: only support
   float32 and float16 for now`); (c) `relax.power` does not build in bf16 (`power only applies
   to float`). `fix` computes each such op in float32 and casts back.
11. **fp16 `tanh` on llvm returns 0 for small x** (x = 1e-6, 1e-5, 1e-4 all give 0; torch returns x;
   1e-3 gives 0.000978, 1e-2 gives 0.01011): Gemma2's attention logit softcapping (`tanh(scores / 50)`) in fp16 becomes all zeros in
   the tiny model (docs/coverage.md's "Causal-LM families by dtype on llvm"). `tapml-dbg record
   examples/family_lms.py:build_gemma2_fp16 -o t.h5 && tapml-dbg bisect t.h5` names `tanh` (isolated);
   `tapml-dbg dump t.h5 --op tanh -o DIR` writes the repro. float32 `tanh` loses relative precision near
   0 too (1.3% at x = 1e-6), which the fp32 Gemma2 row shows.

## Failures that were tapml-dbg's own (fixed)

- **`beit`: a false divergence at `slice_4`** (importer attribution, fixed). `y[1:, 1:] = x`
  exports as `slice → aten.copy → slice_scatter`; TVM's `copy` converter overwrites the
  importer's value of the destination slice, so the copy's binding was credited to the slice
  node and recorded with the slice's torch value. The importer now takes each node's value from
  what its converter returned (`tapml_dbg/frontend/importer.py`); the repro is a test
  (`tests/test_record.py::test_in_place_copy_is_attributed_to_the_copy_node`).
"""


def render(rows: list[dict], *, seconds: float, timeout_s: float, target: str, partial: bool,
           jobs: int = 1) -> str:
    import numpy
    import torch
    import transformers
    import tvm

    lines = [HEADER.format(timeout=timeout_s, tvm=tvm.__version__, target=target, scale=FAULT_SCALE)]
    total = len(rows)
    counts = {stage: sum(row[stage]["status"] == "pass" for row in rows) for stage in STAGES}
    full = sum(passed(row) for row in rows)
    lines.append("## Summary\n")
    lines.append(f"- **{full} of {total} architectures pass every column** "
                 f"(import {counts['import']}, record {counts['record']}, clean {target} "
                 f"{counts['clean']}, fault bisect {counts['fault']}).")
    behind = [row for row in rows if BEHIND in row]
    if behind:
        found = sum(row["fault"]["status"] == "pass" for row in behind)
        lines.append(f"- **Behind the first bug** (`--behind`): in {found} of the {len(behind)} rows whose clean "
                     f"{target} column found a real divergence, the fault planted after it was found at its op, "
                     "past the bug with its `fix` and/or kept ops (the fault column says which).")
    if partial:
        lines.append("- A partial run (some architectures only).")
    lines.append(f"- This run: {seconds / 60:.1f} min wall, {jobs} architecture(s) at a time on "
                 f"{os.cpu_count()} CPU cores shared with other work "
                 f"({platform.machine()}, {platform.system()}), "
                 f"{datetime.datetime.now().strftime('%Y-%m-%d')}; python {platform.python_version()}, "
                 f"torch {torch.__version__}, tvm {tvm.__version__}, transformers {transformers.__version__}, "
                 f"numpy {numpy.__version__}.")
    lines.append("")
    lines.append("## Table\n")
    lines.append(f"| architecture | family | ops | import | record | clean {target} | fault bisect | s |")
    lines.append("|---|---|---:|---|---|---|---|---:|")
    for row in rows:
        cells = [f"`{row['name']}`", row["family"], str(row["ops"] or "")]
        for stage in STAGES:
            cell = row[stage]
            mark = {"pass": "pass", "fail": "**FAIL**", "skipped": "—"}.get(cell["status"], cell["status"])
            text = f"{mark}: {cell['reason']}" if cell["reason"] and cell["status"] != "skipped" else mark
            if stage == "fault" and BEHIND in row:  # past the real bug: what was applied first
                behind = row[BEHIND]
                text = (f"{mark} behind the bug ({behind['reason']})" + (f": {cell['reason']}" if cell["reason"] else "")
                        if behind["status"] == "pass" else f"**FAIL** getting past the bug: {behind['reason']}")
            cells.append(text)
        cells.append(f"{row['seconds']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    failures = [row for row in rows if not passed(row)]
    lines.append("")
    lines.append("## Failures\n")
    if not failures:
        lines.append("None.")
    for row in failures:
        stage = next(s for s in STAGES if row[s]["status"] != "pass")
        cause = KNOWN_CAUSES.get(row["name"])
        lines.append(f"- `{row['name']}` ({stage}): {row[stage]['reason']}"
                     + (f" — cause: {cause}" if cause else ""))
    lines.append("")
    lines.append(LIMITATIONS)
    return "\n".join(lines) + "\n"


def zoo_names(fast: bool = False) -> list[str]:
    from registry import ZOO

    return [name for name, entry in ZOO.items() if not (fast and entry.slow)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="zoo architectures (default: all)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help='markdown file to write ("-": print)')
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per architecture")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--fast", action="store_true", help="skip the slow architectures")
    parser.add_argument("--jobs", type=int, default=1,
                        help="architectures run at once (default 1: row times are then comparable)")
    parser.add_argument("--keep", help="keep traces and logs in this folder")
    parser.add_argument("--behind", action="store_true",
                        help="past a real divergence: its fix (or kept ops), then the planted fault")
    parser.add_argument("--rows", help="a JSON file of every finished row, rewritten as each one ends")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: one architecture
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:
        row_path = Path(args.row)

        def report(row):
            tmp = row_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(row))
            tmp.replace(row_path)

        run_one(args.one, Path(args.work), args.target, report, behind=args.behind)
        return 0

    from registry import ZOO

    names = args.names or zoo_names(args.fast)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown architecture(s) {', '.join(unknown)}; known: {', '.join(ZOO)}")
    started = time.perf_counter()

    done: dict[str, dict] = {}

    def progress(row):
        cells = " ".join(f"{s}={row[s]['status']}" for s in STAGES)
        bad = next((f" [{row[s]['reason']}]" for s in STAGES if row[s]["status"] == "fail"), "")
        if BEHIND in row:
            cells += f" behind={row[BEHIND]['status']} [{row[BEHIND].get('reason', '')}]"
            if row["fault"]["status"] != "skipped":
                cells += f" fault [{row['fault']['reason']}]"
        print(f"{row['name']:<16} {row['seconds']:6.1f}s {cells}{bad}", file=sys.stderr, flush=True)
        if args.rows:  # every finished row so far: a run cut short still leaves them
            done[row["name"]] = row
            Path(args.rows).write_text(json.dumps(done, indent=1))

    rows = run_all(names, timeout_s=args.timeout, target=args.target,
                   work=Path(args.keep) if args.keep else None, jobs=args.jobs, progress=progress,
                   behind=args.behind)
    text = render(rows, seconds=time.perf_counter() - started, timeout_s=args.timeout, target=args.target,
                  partial=bool(args.names) or args.fast, jobs=args.jobs)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}: {sum(passed(r) for r in rows)} of {len(rows)} pass every column",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
