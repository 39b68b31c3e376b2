"""Judge one op's target outputs against its source values: the one place a verdict is made."""

from __future__ import annotations

from typing import Callable

import numpy as np

from tapml_dbg.judge.classify import Evidence, Facts, classify, type_evidence
from tapml_dbg.judge.compare import PolicyKind, TolerancePolicy, compare_output, dtype_name
from tapml_dbg.judge.noise_floor import Reference
from tapml_dbg.judge.verdict import Mode, Status, Verdict, WrongClass

UNDEFINED_MESSAGE = "uninitialised memory in the source (torch.empty): not judged"


def failed_run(index: int, name: str, mode: Mode, status: str, message: str, facts: Facts | None = None) -> Verdict:
    """The verdict of a unit that did not run to the end (compile-error, crash, timeout, error). An op
    whose import changed the type of an output it hands on (`facts`) is of class `type`: the failure is
    that frontend divergence's symptom (a bool cumsum does not compile), as any other verdict of it says."""
    verdict = Verdict(index, name, mode, Status(status), message=message)
    if facts is not None and facts.type_changes:
        verdict.wrong = WrongClass.TYPE
        verdict.evidence = type_evidence(facts.type_changes)
    return verdict


def judge_outputs(index: int, name: str, mode: Mode, outputs: list[np.ndarray], source: list[np.ndarray],
                  policy: TolerancePolicy, tolerance_dtype: str | None = None,
                  unread: set[int] = frozenset(), reference: Reference | None = None,
                  facts: Facts | None = None, evidence: Evidence | Callable[[], Evidence] | None = None) -> Verdict:
    """Compare every output under the policy, and say what kind of wrong a failure is.

    `reference`: the op's float64 reference and undefined elements (`judge.noise_floor`); without
    one, or under `tol fixed`, the fixed rule judges. `tolerance_dtype`: the source's own dtype when
    an old (v1.0/1.1) recorder had to cast its value. `unread`: outputs nothing in the model reads
    (e.g. the indices of max_pool2d_with_indices): reported, never failing the verdict. `facts`: the
    op's type changes and inputs cast at replay time; `evidence`: a second target run and the op
    recomputed in low precision, or a function measuring them, called only for a failure whose
    class the facts do not decide (judge/classify.py).
    """
    reference = reference or Reference()
    facts = facts or Facts()
    if reference.undefined_op:
        return Verdict(index, name, mode, Status.UNDEFINED, message=UNDEFINED_MESSAGE)
    if len(outputs) != len(source):
        return Verdict(index, name, mode, Status.FAIL, message=f"{len(outputs)} outputs vs {len(source)} recorded")
    propagated = mode == Mode.PROPAGATED
    metrics = [compare_output(t, s, policy, tolerance_dtype or dtype_name(s), name, propagated,
                              reference.value(k), reference.mask(k))
               for k, (t, s) in enumerate(zip(outputs, source))]
    live_outputs = [k for k in range(len(metrics)) if k not in unread]
    live = [metrics[k] for k in live_outputs]
    changes = [c for c in facts.type_changes if c.output not in unread]
    status = Status.PASS if all(m.passed for m in live) and not changes else Status.FAIL
    notes = []
    ignored = [k for k in sorted(unread) if k < len(metrics) and not metrics[k].passed]
    if ignored:
        notes.append(f"output(s) {', '.join(map(str, ignored))} differ but nothing reads them (ignored in the verdict)")
    if facts.cast_inputs:
        notes.append("inputs cast at replay time to the type the import declares: " + ", ".join(facts.cast_inputs))
    if reference.note and policy.kind == PolicyKind.NOISE_FLOOR and any(m.policy == PolicyKind.FIXED for m in live):
        notes.append(f"judged by the fixed rule: {reference.note}")
    verdict = Verdict(index, name, mode, status, live or metrics, "; ".join(notes))
    if status == Status.FAIL:
        found = classify(metrics, outputs, source, reference.values, Facts(changes, facts.cast_inputs), evidence,
                         live_outputs)
        verdict.wrong, verdict.evidence = found.wrong, found.evidence
    return verdict
