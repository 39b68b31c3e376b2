"""A verified fix: what `tapml-dbg fix` answers after `triage` named the causes.

For each cause group the rewrites its class suggests are tried, in order, as one transform file
(`engine/fix_transform.py` with its `REWRITES` filled in), and a candidate is kept only when it
verifies: every op of the group passes its isolated verdict under it (the op alone, fed the
recorded inputs). One candidate session judges every group at once (an op's isolated unit holds
that op only, so one group's rewrite cannot change another's verdict), and its mixed run (the
whole model on the target) gives the output's error. Then, as Polygraphy's `debug precision`
does, when the output still fails with float32 pinning in the fix, the lowest failing
low-precision op of the mixed run is pinned too, one at a time, until the output passes (at
most `EXTRA_PINNED` ops); the extra ops are kept only if the output then passes. The transform
written is verified once more as a whole (`output_passed`).

Which rewrites a class suggests (`candidates`):
- precision: the op in float32 (operands cast to float32, the result cast back);
- type: the operands of the declared dtype cast to the dtype the source computed;
- a failed build or run with bool operands: the bool operands as int8;
- `power(x, 2.0 | 3.0)` failing (CUDA's pow is NaN for x < 0): multiplies;
- nondeterministic `take` at a negative constant index (`x[:, -1]`): the index wrapped;
- a build failure or wrong kernel on a GPU target: the op scheduled by DefaultGPUSchedule;
- fused: none (fusion happens inside `tvm.compile`, after a transform; `unfixed` says so).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tapml_dbg.engine.report import OpPoint
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.triage import TYPE_CLASS, CauseGroup, TriageResult, triage
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.verdict import ISOLATED, Status, Verdict, WrongClass
from tapml_dbg.model.units import bindings_by_name
from tapml_dbg.portable.loader import split_spec
from tapml_dbg.portable.runner import device_kind, parse_target

Progress = Callable[..., None]
TEMPLATE = Path(__file__).with_name("fix_transform.py")  # the transform's code, copied verbatim
TRANSFORM_FILE, README_FILE, FUNC = "fix.py", "README.md", "fix"
COMPOSED_FILE = "fix_then_transform.py"  # with --transform: the fix, then the user's pass it was verified with
EXTRA_PINNED = 3  # ops pinned to float32 beyond the groups' own, at most, before the search gives up
LOW_PRECISION = ("float16", "bfloat16")
BOOL_AS = "int8"  # what bool operands become for a target that does not build the op on bool
WIDE = "float32"
STRUCTURAL = ("tuple", "get_item", "alias", "relax.reshape", "relax.permute_dims", "relax.expand_dims",
              "relax.squeeze", "relax.astype", "relax.strided_slice", "relax.concat")  # never pinned: they move data
POW_EXPONENTS = (2.0, 3.0)
FAILURE_CHARS = 100  # a failed run's message in the output's figure, this long at most
FAILED_RUNS = (Status.COMPILE_ERROR, Status.CRASH, Status.ERROR, Status.TIMEOUT)


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass(frozen=True)
class Rewrite:
    """One binding's rewrite in the transform: `REWRITES[name] = (kind, options)`."""

    index: int
    name: str
    kind: str
    options: tuple = ()  # (key, value) pairs, so that a rewrite is hashable

    def entry(self) -> str:
        return f"    {self.name!r}: ({self.kind!r}, {dict(self.options)!r}),  # op #{self.index}"


@dataclass(frozen=True)
class Candidate:
    """A kind of rewrite to try on every op of a group, and what it does in words."""

    kind: str
    options: tuple
    how: str


@dataclass
class Figure:
    """An op's isolated verdict in numbers: its error against its tolerance (rel units), or a failed run."""

    status: str
    error: float | None = None
    tolerance: float | None = None

    @staticmethod
    def of(op, verdict: Verdict | None) -> "Figure":
        if verdict is None:
            return Figure("missing")
        point = OpPoint(op.index, op.name, op.op, op.layer, op.outputs[0].dtype if op.outputs else "", verdict, None)
        status = str(verdict.status)
        if verdict.status == Status.FAIL and _passes(verdict):  # right now, but not the type the trace declares
            status = "pass (the source's dtype)"
        elif verdict.status == Status.FAIL and verdict.wrong == WrongClass.TYPE:
            mismatch = next((m.dtype_mismatch or m.shape_mismatch for m in verdict.metrics
                             if m.dtype_mismatch or m.shape_mismatch), "")
            status = f"fail (type: {mismatch})" if mismatch else "fail (type)"
        return Figure(status, point.error(verdict.mode), point.tolerance(verdict.mode))

    def text(self) -> str:
        if self.error is None:
            return self.status
        bound = f" vs tolerance {self.tolerance:.3g}" if self.tolerance is not None else ""
        return f"{self.status} rel={self.error:.3g}{bound}"

    def to_json(self) -> dict:
        return {"status": self.status, "error": self.error, "tolerance": self.tolerance}


@dataclass
class FixedOp:
    index: int
    name: str
    how: str
    cause: str
    kind: str  # the rewrite kind ("" when the op needs none: it is right once another op is fixed)
    before: Figure
    after: Figure
    extra: bool = False  # pinned by the output search, not by its own group

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "how": self.how, "cause": self.cause, "kind": self.kind,
                "before": self.before.to_json(), "after": self.after.to_json(), "extra": self.extra}


@dataclass
class UnfixedOp:
    index: int
    name: str
    cause: str
    why: str
    tried: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "cause": self.cause, "why": self.why, "tried": self.tried}


@dataclass
class OutputFigure:
    """The model's output in a mixed run with everything offloaded."""

    passed: bool
    error: float
    failing: int | None  # ops failing in that run (None: the run judged the output only)
    failure: str = ""

    @staticmethod
    def of(run) -> "OutputFigure":
        return OutputFigure(run.passed, run.error, len(run.failing_ops()) if run.verdicts else None, run.failure)

    def text(self, chars: int | None = FAILURE_CHARS) -> str:
        """`pass rel=...`, or `FAIL rel=inf (why)` with why cut to `chars` (None: whole)."""
        verdict = "pass" if self.passed else "FAIL"
        failure = self.failure if chars is None or len(self.failure) <= chars else self.failure[:chars - 1] + "…"
        return f"{verdict} rel={self.error:.3g}" + (f" ({failure})" if failure else "")

    def to_json(self) -> dict:
        return {"passed": self.passed, "error": self.error, "failing_ops": self.failing, "failure": self.failure or None}


@dataclass
class FixResult:
    """What `fix` wrote and what it verified."""

    trace: str
    target: str
    folder: str
    fixed: list[FixedOp]
    unfixed: list[UnfixedOp]
    output_before: OutputFigure | None
    output_after: OutputFigure | None
    verified_with: str = ""  # the user's --transform, applied after the fix in every verification
    sessions: int = 0  # candidate sessions opened (each compiles the units its transform changes)
    seconds: float = 0.0
    groups: int = 0

    @property
    def output_passed(self) -> bool:
        return self.output_after is not None and self.output_after.passed

    @property
    def transform(self) -> str:
        """What `--transform` takes to apply the fix (with the user's transform after it, when there was one)."""
        return f"{Path(self.folder) / (COMPOSED_FILE if self.verified_with else TRANSFORM_FILE)}:{FUNC}"

    @property
    def rewritten(self) -> list[FixedOp]:
        return [op for op in self.fixed if op.kind]

    def to_json(self) -> dict:
        return {"fixed": [op.to_json() for op in self.fixed], "unfixed": [op.to_json() for op in self.unfixed],
                "output_passed": self.output_passed, "transform": self.transform, "target": self.target,
                "output_before": self.output_before.to_json() if self.output_before else None,
                "output_after": self.output_after.to_json() if self.output_after else None,
                "groups": self.groups, "sessions": self.sessions, "seconds": round(self.seconds, 3)}


# ---------------------------------------------------------------------------- what to try
def _binding_value(session: Session, name: str):
    binding = bindings_by_name(session.main).get(name)
    return getattr(binding, "value", None)


def _operand_dtypes(value) -> list[str]:
    import tvm
    from tvm import relax

    dtypes = []
    for arg in getattr(value, "args", []) if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else []:
        fields = list(arg.fields) if isinstance(arg, relax.Tuple) else [arg]
        dtypes += [f.ty.dtype for f in fields if isinstance(getattr(f, "ty", None), relax.TensorType)]
    return dtypes


def _pow_exponent(value) -> float | None:
    import tvm
    from tvm import relax

    if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.power"):
        return None
    exponent = value.args[1]
    if isinstance(exponent, tvm.ir.expr.Constant) and exponent.value.numpy().size == 1:
        return float(exponent.value.numpy())
    return None


def _negative_take(value) -> bool:
    import tvm
    from tvm import relax

    if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.take"):
        return False
    indices = value.args[1]
    return isinstance(indices, tvm.ir.expr.Constant) and bool((indices.value.numpy() < 0).any())


def _constant_note(session: Session, index: int, candidate: Candidate) -> str:
    """Why a cast cannot help: the import already turned a constant operand into the declared dtype."""
    import tvm

    value = _binding_value(session, session.ops[index].name)
    old = dict(candidate.options).get("from")
    if candidate.kind != "cast" or old is None:
        return ""
    constants = [arg for arg in getattr(value, "args", []) if isinstance(arg, tvm.ir.expr.Constant)
                 and getattr(arg.ty, "dtype", None) == old]
    if not constants:
        return ""
    shown = constants[0].value.numpy()
    return (f" (its constant operand is already {old} {shown.tolist() if shown.size <= 4 else '...'} in the "
            "import: the source's value is lost before the op, so no cast restores it; fix the import or the model)")


def on_gpu(session: Session) -> bool:
    return device_kind(parse_target(session.target)) != "cpu"


def candidates(session: Session, group: CauseGroup) -> tuple[list[Candidate], str]:
    """The rewrites to try on `group`, in order, and (when there is none) why."""
    first = group.first
    op = session.ops[first.index]
    value = _binding_value(session, op.name)
    dtypes = _operand_dtypes(value)
    out_dtypes = [spec.dtype for spec in op.outputs]
    low = any(dtype in LOW_PRECISION for dtype in dtypes + out_dtypes)
    failed_run = first.verdict in {str(status) for status in FAILED_RUNS}
    found: list[Candidate] = []
    if failed_run and low:  # TVM 0.27 builds no bf16 layer_norm or power on llvm: the op in float32 builds
        found.append(Candidate("float32", (), f"computed in float32 (the target does not build it in "
                                              f"{_low_dtype(dtypes + out_dtypes)}: operands cast to float32, the "
                                              "result cast back)"))
    exponent = _pow_exponent(value)
    if exponent in POW_EXPONENTS:
        found.append(Candidate("pow", (), f"pow(x, {exponent:g}) as {' * '.join(['x'] * int(exponent))} "
                                          "(TVM's CUDA pow is NaN for x < 0)"))
    if group.wrong == TYPE_CLASS:
        change = next((c for c in session.reference.type_changes.get(first.index, [])
                       if c.declared.dtype != c.source.dtype), None)
        if change is not None:
            found.append(Candidate("cast", (("from", change.declared.dtype), ("to", change.source.dtype)),
                                   f"operands of dtype {change.declared.dtype} cast to {change.source.dtype}, the "
                                   f"dtype the source computed (the import declares {change.declared.dtype})"))
    if group.wrong == WrongClass.PRECISION or (group.wrong == WrongClass.NAN_INF and low):
        if low:
            found.append(Candidate("float32", (), "computed in float32 (operands cast to float32, the result cast "
                                                  "back to " + (out_dtypes[0] if out_dtypes else "its dtype") + ")"))
    elif group.wrong == WrongClass.SEMANTIC and low:  # a wrong low-precision kernel (TVM 0.27's fp16 tanh is 0
        # near 0 on llvm): the op's float32 kernel may be right; kept only where its verdict then passes
        found.append(Candidate("float32", (), f"computed in float32 (the target's {_low_dtype(dtypes + out_dtypes)} "
                                              "kernel is wrong: operands cast to float32, the result cast back)"))
    if failed_run and "bool" in dtypes:
        found.append(Candidate("bool-as", (("to", BOOL_AS),), f"bool operands cast to {BOOL_AS} (the target does "
                                                              "not build the op on bool)"))
    if group.wrong == WrongClass.NONDETERMINISTIC and _negative_take(value):
        found.append(Candidate("wrap-index", (), "the negative index of the take wrapped to index + extent (the "
                                                 "import reads x[-1] out of bounds with mode=\"fast\")"))
    if on_gpu(session) and (failed_run or group.wrong in (WrongClass.SEMANTIC, WrongClass.NAN_INF)):
        found.append(Candidate("default-schedule", (("target", session.target),),
                               "the op legalized alone and scheduled by DefaultGPUSchedule, not dlight"))
    if found:
        return found, ""
    return [], _why_none(session, group, failed_run, low)


def _low_dtype(dtypes: list[str]) -> str:
    return next(dtype for dtype in dtypes if dtype in LOW_PRECISION)


def _why_none(session: Session, group: CauseGroup, failed_run: bool, low: bool) -> str:
    if group.wrong == WrongClass.FUSED:
        return ("fused: the op is right alone and wrong fused with its producers; fusion happens inside "
                "tvm.compile after a transform runs, so an IRModule -> IRModule rewrite cannot keep the op out "
                "of its fusion group (build with relax.transform.FuseOps disabled for it, or keep it on the source)")
    if failed_run:
        return (f"{group.first.verdict} on {session.target} with no bool operand to cast, and DefaultGPUSchedule "
                "applies to GPU targets only" if not on_gpu(session) else
                f"{group.first.verdict} with no rewrite that applies")
    if group.wrong == TYPE_CLASS:
        return "the import changes the shape, not the dtype: no cast restores it"
    if group.wrong in (WrongClass.PRECISION, WrongClass.NAN_INF) and not low:
        return "already computed in float32 or wider: no precision to add"
    where = "" if on_gpu(session) else f"; DefaultGPUSchedule applies to GPU targets only, not {session.target}"
    return f"class {group.wrong}: no rewrite known for it{where}"


# ---------------------------------------------------------------------------- the transform text
def transform_text(rewrites: list[Rewrite], trace: str = "", target: str = "",
                   retyped: dict[str, tuple[str, str]] | None = None) -> str:
    """The self-contained `fix.py`: the template's code with `REWRITES` and `RETYPED` set; FUNC's
    `retyped` tells replay which recorded values to feed in the rewritten dtype (`transform_retyped`)."""
    header = (f"# written by `tapml-dbg fix` for {Path(trace).name or 'a trace'} on {target or 'its target'}; "
              f"README.md beside it says what each rewrite does and what it was verified against\n")
    entries = "\n".join(rewrite.entry() for rewrite in sorted(rewrites, key=lambda r: r.index))
    types = "".join(f"    {name!r}: {pair!r},\n" for name, pair in sorted((retyped or {}).items()))
    return (header + TEMPLATE.read_text() + f"\n\nREWRITES = {{\n{entries}\n}}\n"
            f"RETYPED = {{\n{types}}}\n"
            f"{FUNC}.retyped = {{name: dtype for name, (_declared, dtype) in RETYPED.items()}}\n")


def retyped_outputs(session: Session, rewrites: list[Rewrite]) -> dict[str, tuple[str, str]]:
    """The rewritten ops whose one output a cast takes from the declared dtype to the source's:
    name -> (declared, source dtype), what the units reading them must take (`RETYPED`)."""
    found = {}
    for rewrite in rewrites:
        options = dict(rewrite.options)
        if rewrite.kind != "cast" or len(session.ops[rewrite.index].outputs) != 1:
            continue
        for change in session.reference.type_changes.get(rewrite.index, []):
            if (change.output == 0 and not change.stock and change.declared.dtype == options.get("from")
                    and change.source.dtype == options.get("to")):
                found[rewrite.name] = (change.declared.dtype, change.source.dtype)
    return found


def helpers(session: Session, index: int) -> list:
    """The helper bindings of op `index` (`var_p0` of `var`: bindings of the same source op, with no FX
    node of their own), in model order: the op is rewritten and judged together with them."""
    op = session.ops[index]
    found, frontier = {}, list(op.inputs)
    while frontier:
        producer = session.by_name.get(frontier.pop(0))
        if producer is None or producer.index in found or not producer.name.startswith(f"{op.name}_p"):
            continue
        found[producer.index] = producer
        frontier.extend(producer.inputs)
    return [found[i] for i in sorted(found)]


def op_verdict(session: Session, index: int) -> Verdict:
    """Op `index`'s isolated verdict, with its helper bindings in its unit when it has some (the
    source op as one unit, fed the recorded inputs of the source op)."""
    chain = helpers(session, index)
    if not chain:
        return session.isolated(index)
    name = session.ops[index].name
    result = session.lanes.run(session.requests.ops_request([op.name for op in chain] + [name], [name]))
    return session.verdicts.judge(index, ISOLATED, result, result.outputs[0] if result.ok else None)


def composed_text(fix_path: str | Path, transform: str) -> str:
    """A transform file whose FUNC `fix` applies `fix_path`'s fix, then the user's `FILE.py:FUNC`."""
    user_path, user_func = split_spec(transform)
    return (f"# `tapml-dbg fix`: {Path(fix_path).name}, then the transform it was verified with ({transform})\n"
            "import importlib.util\n\n\n"
            "def _load(path, name):\n"
            "    spec = importlib.util.spec_from_file_location(name, path)\n"
            "    module = importlib.util.module_from_spec(spec)\n"
            "    spec.loader.exec_module(module)\n"
            "    return module\n\n\n"
            f"_FIX = _load({str(Path(fix_path).resolve())!r}, 'tapml_fix')\n"
            f"_TRANSFORM = getattr(_load({str(Path(user_path).resolve())!r}, 'tapml_fix_user'), {user_func!r})\n\n\n"
            "def fix(mod):\n"
            "    return _TRANSFORM(_FIX.fix(mod))\n\n\n"
            "fix.retyped = getattr(_FIX.fix, 'retyped', {})  # what replay feeds in the rewritten dtype\n")


def _rewrites(session: Session, group: CauseGroup, candidate: Candidate) -> list[Rewrite]:
    return [Rewrite(each.index, each.name, candidate.kind, candidate.options)
            for op in group.ops for each in [*helpers(session, op.index), session.ops[op.index]]]


# ---------------------------------------------------------------------------- the search
@dataclass
class _Trial:
    rewrites: list[Rewrite]
    verdicts: dict[int, Verdict]
    run: object  # MixedRun


class _Verifier:
    """Candidate sessions: the trace on the user's target under one candidate transform each."""

    def __init__(self, session: Session, folder: Path, progress: Progress):
        self.session = session
        self.folder = folder
        self.progress = progress
        self.count = 0
        self.memo: dict[frozenset, _Trial] = {}

    def trial(self, rewrites: list[Rewrite], judge: list[int]) -> _Trial:
        key = frozenset(rewrites)
        known = self.memo.get(key)
        if known is not None and set(judge) <= set(known.verdicts):
            return known
        self.count += 1
        path = self.folder / f"candidate{self.count}.py"
        path.write_text(transform_text(rewrites, str(self.session.reader.path), self.session.where,
                                       retyped_outputs(self.session, rewrites)))
        if self.session.spec.transform:  # the user's pass runs after the fix, as in their pipeline
            composed = self.folder / f"candidate{self.count}_then_transform.py"
            composed.write_text(composed_text(path, self.session.spec.transform))
            path = composed
        spec = dataclasses.replace(self.session.spec, transform=f"{path}:{FUNC}")
        self.progress(self.count, None, f"candidate {self.count}: {len(rewrites)} rewrite(s)")
        with Session.open(self.session.reader.path, spec, cache_dir=self.session.lanes.pool.config.cache_dir,
                          policy=self.session.verdicts.policy, start_workers=True) as trial:
            verdicts = {index: op_verdict(trial, index) for index in sorted(set(judge))}
            run = trial.run_mixed(list(range(len(trial.ops))), verdicts=True)
        result = _Trial(list(rewrites), verdicts, run)
        self.memo[key] = result
        return result


def fix(session: Session, folder: str | Path, progress: Progress = _noop,
        triaged: TriageResult | None = None) -> FixResult:
    """Triage (unless `triaged` is given), try and verify rewrites per cause, write `folder/fix.py`
    and `folder/README.md`; the result says what was fixed, what not and why."""
    started = time.perf_counter()
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file: give a folder for fix.py and README.md")
    triaged = triaged if triaged is not None else triage(session, progress)
    before_run = session.run_mixed(list(range(len(session.ops))), verdicts=False)
    output_before = OutputFigure.of(before_run)
    before = {op.index: Figure.of(session.ops[op.index], op_verdict(session, op.index))
              for group in triaged.groups for op in group.ops}
    plans: dict[int, list[Candidate]] = {}
    unfixed_why: dict[int, str] = {}
    tried: dict[int, list[str]] = {}
    for number, group in enumerate(triaged.groups):
        plans[number], why = candidates(session, group)
        if not plans[number]:
            unfixed_why[number] = why
        tried[number] = []
    accepted: dict[int, tuple[Candidate, dict[int, Verdict]]] = {}
    with tempfile.TemporaryDirectory(prefix="tapml-fix-") as scratch:
        verifier = _Verifier(session, Path(scratch), progress)
        last: _Trial | None = None
        while any(plans[number] for number in plans if number not in accepted):
            trying = {number: plans[number].pop(0) for number in plans if number not in accepted and plans[number]}
            rewrites = _accepted_rewrites(session, triaged, accepted) + [
                rewrite for number, candidate in trying.items() for rewrite in _rewrites(session, triaged.groups[number], candidate)]
            judge = [op.index for number in trying for op in triaged.groups[number].ops]
            last = verifier.trial(rewrites, judge)
            for number, candidate in trying.items():
                group = triaged.groups[number]
                failing = [op for op in group.ops if not _passes(last.verdicts.get(op.index))]
                if not failing:
                    accepted[number] = (candidate, {op.index: last.verdicts[op.index] for op in group.ops})
                    unfixed_why.pop(number, None)
                else:
                    worst = failing[0]
                    after = Figure.of(session.ops[worst.index], last.verdicts.get(worst.index))
                    tried[number].append(f"{candidate.kind}: #{worst.index} still {after.text()}")
                    unfixed_why[number] = (f"{candidate.how}: does not verify: op #{worst.index} {after.text()}"
                                           + _constant_note(session, worst.index, candidate))
        final_rewrites = _accepted_rewrites(session, triaged, accepted)
        final = verifier.trial(final_rewrites, []) if final_rewrites or last is not None else _Trial([], {}, before_run)
        final = _hold_together(session, verifier, triaged, accepted, unfixed_why, tried, final)
        final_rewrites = final.rewrites
        extra: list[Rewrite] = []
        if not final.run.passed and any(c.kind == "float32" for c, _ in accepted.values()):
            extra, final = _pin_more(session, verifier, final_rewrites, final)
        sessions = verifier.count
    fixed, unfixed = _outcome(session, triaged, accepted, unfixed_why, tried, before, final)
    fixed += _pinned_by_output_search(session, extra, final)
    result = FixResult(str(session.reader.path), session.where, str(out), fixed, unfixed, output_before,
                       OutputFigure.of(final.run), verified_with=session.spec.transform or "", sessions=sessions,
                       groups=len(triaged.groups))
    result.seconds = time.perf_counter() - started
    write_fix(result, final_rewrites + extra, retyped_outputs(session, final_rewrites + extra))
    return result


def stopped_at(run) -> int | None:
    """The op at which a whole-model run stopped (its unit failed to build or run), or None."""
    failed = [index for index, verdict in run.verdicts.items() if verdict.status in FAILED_RUNS]
    return min(failed) if run.failure and failed else None


def _hold_together(session: Session, verifier: _Verifier, triaged: TriageResult, accepted: dict,
                   unfixed_why: dict, tried: dict, final: _Trial) -> _Trial:
    """The accepted rewrites verified as a whole: while the whole-model run with them stops at an op
    that a rewrite touches (the op itself, or one whose value it reads), the groups of those rewrites
    are taken out (`unfixed`, saying where the model stopped) and the rest verified again."""
    while True:
        index = stopped_at(final.run)
        if index is None:
            return final
        op = session.ops[index]
        near = {index} | {session.by_name[name].index for name in op.inputs if name in session.by_name}
        breaking = [number for number, (candidate, _) in accepted.items()
                    if any(r.index in near for r in _rewrites(session, triaged.groups[number], candidate))]
        if not breaking:  # it stops at a cause no rewrite touches (unfixed): not the composition's doing
            return final
        verdict = final.run.verdicts[index]
        message = " ".join((verdict.message or "").split())[:FAILURE_CHARS]
        for number in breaking:
            candidate, _ = accepted.pop(number)
            tried[number].append(f"{candidate.kind}: passes alone, the whole model stops at #{index}")
            unfixed_why[number] = (f"{candidate.how}: passes alone, but the whole-model run with it stops at "
                                   f"#{index} {op.name} ({verdict.status}: {message}), so it is not written")
        final = verifier.trial(_accepted_rewrites(session, triaged, accepted), [])


def _passes(verdict: Verdict | None) -> bool:
    """The op verifies: its verdict passes, or fails only on the trace's declared type (a type verdict
    is judged against what the import declared) while the rewritten op's values and dtype now agree
    with the source's."""
    if verdict is None:
        return False
    if verdict.status == Status.PASS:
        return True
    return (verdict.status == Status.FAIL and verdict.wrong == WrongClass.TYPE and bool(verdict.metrics)
            and all(m.passed and not m.dtype_mismatch and not m.shape_mismatch for m in verdict.metrics))


def _accepted_rewrites(session: Session, triaged: TriageResult, accepted: dict) -> list[Rewrite]:
    return [rewrite for number, (candidate, _) in sorted(accepted.items())
            for rewrite in _rewrites(session, triaged.groups[number], candidate)]


def _pin_more(session: Session, verifier: _Verifier, rewrites: list[Rewrite], final: _Trial) -> tuple[list[Rewrite], _Trial]:
    """Polygraphy's `debug precision`, one op at a time: pin the lowest failing low-precision op of the
    whole-model run to float32, until the output passes; the extra ops only if it then does."""
    pinned = {rewrite.name for rewrite in rewrites}
    extra: list[Rewrite] = []
    trial = final
    for _ in range(EXTRA_PINNED):
        next_op = next((session.ops[index] for index in trial.run.failing_ops()
                        if session.ops[index].name not in pinned and _pinnable(session, session.ops[index])), None)
        if next_op is None:
            break
        extra.append(Rewrite(next_op.index, next_op.name, "float32"))
        pinned.add(next_op.name)
        trial = verifier.trial(rewrites + extra, [])
        if trial.run.passed:
            return extra, trial
    return [], final


def _with_helpers(session: Session, index: int) -> str:
    chain = helpers(session, index)
    return f", with its helper binding(s) {', '.join(op.name for op in chain)}" if chain else ""


def _pinnable(session: Session, op) -> bool:
    return op.relax_op not in STRUCTURAL and any(spec.dtype in LOW_PRECISION for spec in op.outputs)


def _outcome(session: Session, triaged, accepted, unfixed_why, tried, before, final):
    """Each triaged group's ops, fixed (by its accepted rewrite, or right once the others are rewritten) or not (why)."""
    fixed: list[FixedOp] = []
    unfixed: list[UnfixedOp] = []
    failing_now = set(final.run.failing_ops())
    rewritten = [f"#{r.index}" for r in final.rewrites]
    for number, group in enumerate(triaged.groups):
        if number in accepted:
            candidate, verdicts = accepted[number]
            fixed += [FixedOp(op.index, op.name, candidate.how + _with_helpers(session, op.index), group.cause,
                              candidate.kind, before[op.index], Figure.of(session.ops[op.index], verdicts[op.index]))
                      for op in group.ops]
            continue
        follows = rewritten and not final.run.failure and all(
            op.index in final.run.verdicts and op.index not in failing_now for op in group.ops)
        if follows:  # no rewrite of its own verified, but right in the whole model under the others
            fixed += [FixedOp(op.index, op.name, f"no rewrite of its own: right in the whole model once "
                              f"{', '.join(rewritten)} are rewritten (it reads their values)", group.cause, "",
                              before[op.index], Figure.of(session.ops[op.index], final.run.verdicts[op.index]))
                      for op in group.ops]
            continue
        why = unfixed_why.get(number, "no rewrite verified")
        unfixed += [UnfixedOp(op.index, op.name, group.cause, why, list(tried[number])) for op in group.ops]
    return fixed, unfixed


def _pinned_by_output_search(session: Session, extra: list[Rewrite], final: _Trial) -> list[FixedOp]:
    """The ops `_pin_more` pinned to float32 beyond the groups' fixes, as fixed ops."""
    fixed: list[FixedOp] = []
    for rewrite in extra:
        op = session.ops[rewrite.index]
        fixed.append(FixedOp(op.index, op.name, "computed in float32 (pinned by the output search: the output "
                                                "failed with the groups' fixes alone)", "output still failing",
                             "float32", Figure.of(op, session.isolated(op.index)),
                             Figure.of(op, final.run.verdicts.get(op.index)), extra=True))
    return fixed


# ---------------------------------------------------------------------------- the files
def write_fix(result: FixResult, rewrites: list[Rewrite], retyped: dict[str, tuple[str, str]] | None = None) -> None:
    folder = Path(result.folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRANSFORM_FILE).write_text(transform_text(rewrites, result.trace, result.target, retyped))
    if result.verified_with:
        (folder / COMPOSED_FILE).write_text(composed_text(folder / TRANSFORM_FILE, result.verified_with))
    (folder / README_FILE).write_text(readme_text(result))


def readme_text(result: FixResult) -> str:
    lines = [f"# A fix for {Path(result.trace).name} on {result.target}", "",
             f"Written by `tapml-dbg fix`: `{TRANSFORM_FILE}` holds FUNC `{FUNC}(mod: tvm.IRModule) -> tvm.IRModule`, "
             "which rewrites the Relax bindings named in its `REWRITES` (by binding name, in every Relax function "
             "of the module) and leaves every other binding as it is. Apply it:", "",
             f"    tapml-dbg run {result.trace} --offload all --target {result.target} --transform {result.transform}", "",
             "or in your own pipeline, before the build:", "",
             "    import importlib.util, tvm",
             f"    spec = importlib.util.spec_from_file_location('tapml_fix', '{TRANSFORM_FILE}')",
             "    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)",
             "    mod = module.fix(mod)            # the imported model (from_exported_program)",
             f"    executable = tvm.compile(mod, target={result.target!r})", "",
             "## Verified against", "",
             "Each rewrite was judged by the op's isolated verdict (the op alone on the target, fed the recorded "
             "source inputs, against the recorded output with the session's tolerance) and by a mixed run of the "
             "whole model with every op on the target (`run --offload all`), under the transform as written"
             + (f", followed by the transform it was verified with ({result.verified_with}; `{COMPOSED_FILE}` "
                "applies both)" if result.verified_with else "") + ".", "",
             f"- the model's output without the fix: {result.output_before.text() if result.output_before else 'not run'}",
             f"- the model's output with the fix: {result.output_after.text() if result.output_after else 'not run'} "
             f"({'passes' if result.output_passed else 'still FAILS'})", ""]
    if result.fixed:
        lines += ["## Rewrites", "", "| op | name | rewrite | op before | op after |", "|---|---|---|---|---|"]
        lines += [f"| #{op.index} | `{op.name}` | {op.how} | {op.before.text()} | {op.after.text()} |"
                  for op in result.fixed]
        lines.append("")
    if result.unfixed:
        lines += ["## Not fixed", "", "| op | name | cause | why |", "|---|---|---|---|"]
        lines += [f"| #{op.index} | `{op.name}` | {op.cause} | {op.why} |" for op in result.unfixed]
        lines.append("")
    if not result.fixed and not result.unfixed:
        lines += ["Triage found no divergence: the transform rewrites nothing.", ""]
    return "\n".join(lines)
