"""Verdicts: the rule that judges an op's target value, and what a verdict says beyond pass or fail.

`judge` turns a unit's run into a verdict (judge/judge.py's rule, fed the session's live source
reference: float64 references, type changes, the low-precision evidence); a propagated failure of
an op that is right alone inherits the class of the upstream op it comes from; `explain` runs a
failing unit again to tell a nondeterministic kernel from a wrong one. A search asks here what the
worker's screen may clear (`screen_rule`) and what only a full verdict can judge (`unscreened`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tapml_dbg.engine.isolated import IsolatedVerdicts
from tapml_dbg.engine.kept import KeptOps
from tapml_dbg.engine.propagation import PropagatedReplay
from tapml_dbg.engine.references import SourceReference
from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.trace_ops import TraceOps
from tapml_dbg.errors import TraceError
from tapml_dbg.judge.classify import Evidence, Facts
from tapml_dbg.judge.compare import TolerancePolicy
from tapml_dbg.judge.judge import failed_run, judge_outputs
from tapml_dbg.judge.screen import ScreenRule, rule_for
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode, Status, Verdict, WrongClass
from tapml_dbg.portable.codec import dtype_name
from tapml_dbg.runtime.messages import Result
from tapml_dbg.runtime.scheduler import Runtime
from tapml_dbg.trace.schema import CAST_NOTE_PREFIX

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


def _still_changed(change, outputs: list[np.ndarray] | None) -> bool:
    """The target still computes `change`'s output in the declared type: true unless its value came
    back in the source's dtype and shape (a transform, e.g. `fix`'s cast, retyped the op). A stock
    import's change is a finding whatever the target gives (the target runs the recorded import)."""
    if change.stock or outputs is None or change.output >= len(outputs) or outputs[change.output] is None:
        return True
    value = np.asarray(outputs[change.output])
    return dtype_name(value) != change.source.dtype or tuple(value.shape) != tuple(change.source.shape)


class Verdicts:
    """The verdicts of one session's ops under its tolerance policy: isolated ones (cached by its
    `IsolatedVerdicts`) and propagated ones (the `PropagatedReplay`'s values)."""

    def __init__(self, trace_ops: TraceOps, reference: SourceReference, requests: RequestBuilder, lanes: Runtime,
                 replay: PropagatedReplay, kept: KeptOps, policy: TolerancePolicy):
        self.ops = trace_ops.ops
        self.by_name = trace_ops.by_name
        self.reader = trace_ops.reader
        self.recorded = trace_ops.recorded
        self.dead_fields = trace_ops.dead_fields
        self.source_values = trace_ops.source_values
        self.reference = reference
        self.requests = requests
        self.lanes = lanes
        self.replay = replay
        self.kept = kept
        self.policy = policy  # replaced, never changed in place: `set_policy`
        self.isolated_verdicts = IsolatedVerdicts(self.ops, requests, lanes, self.judge)

    def set_policy(self, policy: TolerancePolicy) -> None:
        """Judge by `policy` from now on (the REPL's `tol`): the verdicts cached under the old one are
        forgotten (a propagated replay's target values stay: the policy judges values, it makes none)."""
        self.policy = policy
        self.clear()

    def isolated(self, index: int) -> Verdict:
        """The op alone, fed recorded source inputs: is this kernel wrong? (A host-only op: no verdict.)"""
        stand_in = self.kept.host_only_verdict(index, ISOLATED)
        return self.isolated_verdicts.get(index) if stand_in is None else stand_in

    def propagated(self, index: int) -> Verdict:
        """The op fed the target's own upstream values (ops in the offload set run on the target)."""
        stand_in = self.kept.host_only_verdict(index, PROPAGATED)
        return self.propagated_value(index)[0] if stand_in is None else stand_in

    def propagated_value(self, index: int) -> tuple[Verdict, list[np.ndarray] | None]:
        """Op `index`'s propagated verdict in the replay and its target value (None when it has none)."""
        op = self.ops[index]
        try:
            result, outputs = self.replay.run(index)
        except TraceError as exc:
            return Verdict(index, op.name, PROPAGATED, Status.MISSING, message=str(exc)), None
        return self.judge(index, PROPAGATED, result, outputs), outputs

    def tolerance_dtype(self, index: int) -> str | None:
        """The source's own dtype when the recorder had to cast its value (e.g. fp16 mm -> fp32): an
        older trace's note. A trace with its source graph keeps its own values and lists type changes
        in the graph (engine/references.py): no note to read (a search asks for every op's)."""
        if self.reference.graph is not None:
            return None
        note = self.reader.recorded.op_note(index) if index in self.recorded else ""
        return note[len(CAST_NOTE_PREFIX):] if note.startswith(CAST_NOTE_PREFIX) else None

    def judge(self, index: int, mode: Mode, result: Result, outputs: list[np.ndarray] | None,
              rerun: list[np.ndarray] | None = None, fed_by_target: set[str] | None = None) -> Verdict:
        """The verdict of op `index` given what its unit returned (`rerun`: a second run's outputs,
        the evidence of a `nondeterministic` class; `fed_by_target`: the ops whose target values fed
        it, when not the session's propagated replay, e.g. in a mixed run)."""
        op = self.ops[index]
        if not result.ok:  # of class `type` when the op's import changed a type the model reads
            dead = self.dead_fields.get(op.name, set())
            changes = [c for c in self.reference.type_changes.get(index, []) if c.output not in dead]
            return failed_run(index, op.name, mode, result.status, result.message, Facts(changes))
        if index not in self.recorded:
            return Verdict(index, op.name, mode, Status.MISSING, message=self.reader.recorded.missing_values_message(index))
        reference = self.reference.isolated(index) if mode == ISOLATED else self.reference.propagated(index)
        if fed_by_target is None:
            fed_by_target = set(self.replay.values) if mode == PROPAGATED else set()
        facts = Facts([c for c in self.reference.type_changes.get(index, []) if _still_changed(c, outputs)],
                      self.requests.cast_inputs(index, fed_by_target, self.dead_fields))

        def evidence() -> Evidence:
            found = self.reference.low_precision(index)
            found.rerun = rerun
            return found

        verdict = judge_outputs(index, op.name, mode, outputs, self.source_values(index), self.policy,
                                self.tolerance_dtype(index), self.dead_fields.get(op.name, set()),
                                reference=reference, facts=facts, evidence=evidence)
        if mode == PROPAGATED and verdict.status == Status.FAIL and verdict.wrong != WrongClass.TYPE:
            self._inherit_class(verdict)
        return verdict

    def screen_rule(self, mode: Mode) -> ScreenRule:
        """What a search checks values against before it asks for a verdict (judge/screen.py)."""
        return rule_for(self.policy, mode == PROPAGATED)

    def unscreened(self) -> set[str]:
        """Ops only a full verdict can judge: a per-op tolerance, uninitialised elements, a value the
        recorder cast (its tolerance is its source dtype's)."""
        names = set(self.policy.by_op)
        names.update(self.ops[i].name for i in self.reference.undefined_masks())
        names.update(self.ops[i].name for i in self.recorded if self.tolerance_dtype(i))
        return names

    def _inherit_class(self, verdict: Verdict) -> None:
        """A propagated failure of an op that is right alone (its isolated verdict passed) is the kind of
        wrong of the upstream op it comes from: the nearest ancestor whose isolated verdict failed. One
        of an op that is wrong alone too, and unexplained by its own inputs, is its isolated kind."""
        own = self.isolated_verdicts.cache.get(verdict.index)
        if own is not None and own.status == Status.FAIL and own.wrong is not None \
                and verdict.wrong == WrongClass.SEMANTIC:
            verdict.wrong, verdict.evidence = own.wrong, f"as the op alone (isolated): {own.evidence}"
            return
        if own is None or not own.passed:
            return
        seen, frontier = set(), list(self.ops[verdict.index].inputs)
        while frontier:
            name = frontier.pop(0)
            upstream = self.by_name.get(name)
            if upstream is None or upstream.index in seen:
                continue
            seen.add(upstream.index)
            cached = self.isolated_verdicts.cache.get(upstream.index)
            if cached is not None and cached.status == Status.FAIL and cached.wrong is not None:
                verdict.wrong = cached.wrong
                verdict.evidence = (f"the op alone passes; the error arrives from #{upstream.index} {upstream.name} "
                                    f"({cached.wrong}: {cached.evidence})")
                return
            frontier.extend(upstream.inputs)
        verdict.evidence = f"the op alone passes (isolated); the error arrives from upstream. {verdict.evidence}"

    def explain(self, verdict: Verdict, upstream: dict[str, list[np.ndarray]] | None = None) -> Verdict:
        """A failing verdict judged again with a second run of its unit on the target, so that a
        nondeterministic kernel (an out-of-bounds read, a race) is told from a wrong one.
        `upstream`: the target values that fed a propagated verdict (a search's chain), run again
        as they are instead of the session's propagated replay."""
        if verdict.status != Status.FAIL or verdict.wrong == WrongClass.TYPE:
            return verdict
        index = verdict.index
        fed = None
        try:
            if verdict.mode == ISOLATED or upstream is not None:
                name = self.ops[index].name
                runs = self.isolated_verdicts.runs_of(index) if upstream is None else []  # the sweep's
                while len(runs) < 2:
                    runs.append(self.lanes.run(self.requests.ops_request([name], [name], upstream)))
                outputs = [run.outputs[0] if run.ok else None for run in runs]
                fed = set(upstream) if upstream is not None else None
            else:  # the first run computes the target's upstream values; the next two are the same unit
                runs = [self.replay.run(index) for _ in range(3)][1:]
                outputs = [run[1] for run in runs]
                runs = [run[0] for run in runs]
        except TraceError:
            return verdict
        if not runs[0].ok or outputs[0] is None or outputs[1] is None:
            return verdict
        explained = self.judge(index, verdict.mode, runs[0], outputs[0], rerun=outputs[1], fed_by_target=fed)
        if verdict.mode == ISOLATED:
            self.isolated_verdicts.cache[index] = explained
        return explained

    def type_changed_ops(self) -> list[int]:
        """Ops whose import declares another dtype or shape than the source computed for an output
        the model reads (a type verdict each), in order."""
        return sorted(index for index, changes in self.reference.type_changes.items()
                      if any(c.output not in self.dead_fields.get(self.ops[index].name, set()) for c in changes))

    def type_changed_names(self) -> set[str]:
        """`type_changed_ops` by name: a propagated screen never clears them (their verdict is a type one)."""
        return {self.ops[i].name for i in self.type_changed_ops()}

    def clear(self) -> None:
        """Forget cached verdicts, e.g. after the tolerance policy changed."""
        self.isolated_verdicts.clear()

    def isolated_many(self, indices: list[int], progress: Progress = _noop) -> dict[int, Verdict]:
        """Isolated verdicts of many ops, batched and spread over the lanes (no early stop)."""
        self.isolated_verdicts.fill(list(indices), progress=progress)
        return {index: self.isolated_verdicts.get(index) for index in indices}
