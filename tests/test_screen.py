"""The search's screen (judge/screen.py): a value it passes is one the full verdict passes, and it
clears the plainly right values a search sees, so that the search asks for few verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import fault_transform
from tapml_dbg.judge.compare import PolicyKind, Tolerance, TolerancePolicy, compare_output
from tapml_dbg.judge.screen import clearly_passes, rule_for
from tapml_dbg.engine.isolated import SweepPlan
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.verdict import ISOLATED


def _full_verdict(target, source, reference, policy, propagated) -> bool:
    return compare_output(target, source, policy, str(source.dtype), "op", propagated, reference).passed


@pytest.mark.parametrize("kind", [PolicyKind.NOISE_FLOOR, PolicyKind.FIXED])
@pytest.mark.parametrize("propagated", [False, True])
def test_what_the_screen_passes_the_full_verdict_passes(kind, propagated):
    """Sources with their own error against float64 references of every size, targets off by
    every size: the screen never passes a value the full verdict fails, and it does pass some."""
    rng = np.random.default_rng(7)
    policy = TolerancePolicy(kind=kind)
    rule = rule_for(policy, propagated)
    cleared = disagreements = 0
    for trial in range(3000):
        shape = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
        reference = rng.standard_normal(shape) * 10.0 ** rng.uniform(-6, 4)
        source_err = 10.0 ** rng.uniform(-9, -2)  # relative to the scale, from exact-ish to bad
        source = (reference * (1 + source_err * rng.standard_normal(shape))).astype(np.float32)
        target_err = 10.0 ** rng.uniform(-9, -1)
        target = (source.astype(np.float64) + target_err * np.abs(reference).max() * rng.standard_normal(shape))
        target = target.astype(np.float32)
        if trial % 7 == 0:  # a few elements off only
            target = source.copy()
            target.flat[int(rng.integers(target.size))] *= np.float32(1 + target_err)
        if clearly_passes([target], [source], rule):
            cleared += 1
            disagreements += not _full_verdict(target, source, reference, policy, propagated)
    assert disagreements == 0
    assert cleared > 300


def test_non_finite_values_and_integers():
    rule = rule_for(TolerancePolicy(), propagated=True)
    mask = np.array([0.0, -np.inf, 1.5, np.nan], dtype=np.float32)
    assert clearly_passes([mask.copy()], [mask], rule)  # the same -inf and NaN: the finite rest decides
    moved = mask.copy()
    moved[1], moved[0] = 0.0, -np.inf
    assert not clearly_passes([moved], [mask], rule)
    assert not clearly_passes([np.full(4, np.nan, np.float32)], [mask], rule)
    ints = np.arange(6, dtype=np.int64)
    assert clearly_passes([ints.copy()], [ints], rule)
    assert not clearly_passes([ints + (ints == 3)], [ints], rule)
    assert not clearly_passes([ints.astype(np.int32)], [ints], rule)  # a type change is the verdict's
    assert not clearly_passes([np.zeros((2, 3), np.float32)], [np.zeros((3, 2), np.float32)], rule)


def test_a_one_percent_fault_is_never_cleared():
    rng = np.random.default_rng(0)
    source = rng.standard_normal((64, 64)).astype(np.float32)
    for propagated in (False, True):
        rule = rule_for(TolerancePolicy(), propagated)
        assert not clearly_passes([source * np.float32(1.01)], [source], rule)
        assert clearly_passes([source * np.float32(1 + 1e-7)], [source], rule)


def test_a_clean_bisect_clears_its_ops_without_verdicts_and_every_full_verdict_agrees(traces):
    with Session.open(traces.get("mlp")) as session:
        result = session.bisect()
        assert not result.diverged
        with_outputs = [op.index for op in session.ops if op.outputs]
        screened = session.isolated_verdicts.screened
        assert len(screened) > len(with_outputs) // 2  # most ops needed no verdict
        assert all(session.isolated(i).passed for i in screened)  # and each of them does pass


def test_a_searching_sweep_stops_each_batch_at_its_first_suspect(traces, tmp_path):
    """A sweep for the lowest failing op stops a batch at its first suspect: suspects that pass
    (ops with a per-op tolerance, always suspects) send the rest of the batch again, a planted
    fault ends the sweep with no op above it run."""
    path = traces.get("mlp")
    with Session.open(path) as session:
        swept = [op.index for op in session.ops if op.outputs]
        fault = session.ops[swept[9]]
        passing = [session.ops[swept[2]].name, session.ops[swept[5]].name]
    policy = TolerancePolicy(by_op={name: Tolerance(rtol=1e-4, atol=1e-6) for name in passing})
    with Session.open(path, transform=fault_transform(tmp_path, "scale", fault.name), policy=policy) as session:
        sweep = session.isolated_verdicts
        before = session.lanes.units
        failing = sweep.lowest_failing(swept, SweepPlan(screen=session.verdicts.screen_rule(ISOLATED),
                                                          unscreened=session.verdicts.unscreened()))
        assert failing is not None and failing.index == fault.index
        assert session.lanes.units - before == 3  # one batch, stopped at each passing suspect, then at the fault
        below, above = [i for i in swept if i < fault.index], [i for i in swept if i > fault.index]
        assert all(i in sweep.screened or sweep.cache[i].passed for i in below)
        assert {session.by_name[name].index for name in passing} <= set(sweep.cache)
        assert not any(i in sweep.screened or i in sweep.cache for i in above)


def test_a_sweep_beside_compiles_ahead_runs_the_built_units_first_and_the_others_after(traces, tmp_path):
    """While compile lanes build ahead (`building`), a batch skips the ops whose units are not built
    yet (the ones a transform edit changed) instead of waiting for them; they run at the end, so
    the answer is the one a sweep that waits gives."""
    path = traces.get("mlp")
    with Session.open(path) as session:
        swept = [op.index for op in session.ops if op.outputs]
        fault = session.ops[swept[9]]
    with Session.open(path, transform=fault_transform(tmp_path, "scale", fault.name),
                      cache_dir=tmp_path / "cache") as session:
        built = swept[:4]
        for index in built:  # their units are in the cache; no other op's is
            session.isolated(index)
        sweep, deferred = session.isolated_verdicts, []
        counted = session.lanes.counted

        def counting(result):
            deferred.append(([session.by_name[name].index for name in result.deferred], result.unit_keys))
            return counted(result)

        session.lanes.counted = counting
        rest = [i for i in swept if i not in built]
        sweep.fill(rest, SweepPlan(screen=session.verdicts.screen_rule(ISOLATED), unscreened=session.verdicts.unscreened(),
                                   stop_at_failure=True, compiled=True,
                                   building=lambda: True))  # nobody builds: all left to the end
        first_skipped, first_ran = deferred[0]
        assert first_skipped and first_ran  # the ops of a built unit's copy ran, the others were skipped ...
        assert all(cached for _key, cached in first_ran)  # ... so the first batch built nothing, waited for nothing
        assert min(i for i, verdict in sweep.cache.items() if verdict.failed) == fault.index
        assert all(i in sweep.screened or sweep.cache[i].passed for i in rest if i < fault.index)
