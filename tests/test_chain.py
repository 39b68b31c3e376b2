"""The per-op chain search (engine/chain.py) on planted faults: suspects that pass are accepted and
the chain runs again; an op that is right alone but wrong on the target's values is a propagated
culprit, told from the chain's own values."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import fault_transform
from tapml_dbg.engine.phases_sweep import IsolatedSweep
from tapml_dbg.engine.search import Bisection
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.compare import PolicyKind, Tolerance, TolerancePolicy
from tapml_dbg.judge.noise_floor import NoiseFloor


def test_suspects_that_pass_are_accepted_and_the_chain_runs_again(traces, tmp_path):
    """Ops with a per-op tolerance are always suspects (only the full verdict knows their rule):
    ten of them before a planted fault make the first chain stop at eight passing suspects."""
    path = traces.get("mlp")
    with Session.open(path) as session:
        early = [op.name for op in session.ops[:12] if op.outputs]
    policy = TolerancePolicy(by_op={name: Tolerance(rtol=1e-4, atol=1e-6) for name in early})
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    with Session.open(path, transform=transform, policy=policy) as session:
        assert set(early) <= session.verdicts.unscreened()
        bisection = Bisection(session)
        result = bisection.run()
    assert (result.culprit.name, result.culprit.verdict) == ("gelu_1", "isolated")
    assert bisection.chain.runs == 2  # 8 suspects, all passing, then the rest in a second run
    assert result.search[-2:] == [(12, False), (13, True)]


def test_an_op_right_alone_but_wrong_on_target_values_is_a_propagated_culprit(traces, tmp_path):
    """A x(1 + 1e-5) fault is inside the isolated bound; with a propagated bound made 50x stricter
    than the isolated one it fails on the chain's values: the chain names it, propagated, and the
    second run that tells a nondeterministic kernel from a wrong one reruns it on those values."""
    path = traces.get("mlp")
    policy = TolerancePolicy(noise=NoiseFloor(propagated_factor=0.02))
    transform = fault_transform(tmp_path, "scale", "addmm", scale="1.00001")
    with Session.open(path, transform=transform, policy=policy) as session:
        assert session.isolated(2).passed  # right alone
        bisection = Bisection(session)
        result = bisection.run()
        assert bisection.chain.index == 2 and set(bisection.chain.upstream) == {"addmm_p0"}
    culprit = result.culprit
    assert (culprit.index, culprit.name, culprit.verdict) == (2, "addmm", "propagated")
    assert culprit.wrong is not None and culprit.wrong != "nondeterministic"


def test_prepare_compiles_ahead_only_what_the_cache_lacks(traces, tmp_path, monkeypatch):
    """With compile lanes, the chain's distinct units are compiled side by side first; the cache's
    index (unit as built -> key, per target and transform file) lets the next session skip that,
    also for the units after the fault that the first chain, stopped there, never ran. Those builds
    are no units of the search's: its probes are what it ran, as without compile lanes."""
    monkeypatch.setenv("TAPML_COMPILE_LANES", "2")
    path, cache = traces.get("mlp"), tmp_path / "cache"
    transform = fault_transform(tmp_path, "scale", "addmm")  # op 2: most units come after it
    runs = []
    for _ in range(2):
        with Session.open(path, transform=transform, cache_dir=cache) as session:
            result = session.bisect()
            cache_report = session.lanes.cache  # less the fused probes built ahead on idle cycles: speculative,
            runs.append((sum(session.lanes.compile_pool.units),  # how many a session gets to is timing's
                         cache_report.compiled - cache_report.compiled_ahead))
            units = len([op for op in session.ops if op.outputs])
        assert (result.culprit.name, result.culprit.verdict) == ("addmm", "isolated")
        assert result.probes < units // 2, result.probes  # (with each build ahead counted: more than the ops)
    (first_lanes, first_built), (second_lanes, second_built) = runs
    assert first_lanes > 0 and first_built > 0  # compiled ahead on the compile lanes
    assert second_lanes == 0 and second_built == 0  # all known to be cached: no compile lane started
    assert list((cache / "index").glob("*.json"))


def test_an_edited_transform_is_noticed_between_two_searches(traces, tmp_path):
    """A pass edited in place between two bisects of one session (the REPL's edit-and-rerun loop):
    the second search runs under the new text, without the first one's verdicts. (Kept, the
    cached failing verdict of the old fault's op would be named again.)"""
    early = fault_transform(tmp_path, "scale", "addmm")  # op 2
    late = fault_transform(tmp_path, "scale", "gelu_1")  # op 13
    path = early.rpartition(":")[0]
    with Session.open(traces.get("mlp"), transform=early) as session:
        first = session.bisect()
        assert first.culprit.name == "addmm" and not any("changed since" in n for n in first.notes)
        Path(path).write_text(Path(late.rpartition(":")[0]).read_text())
        second = session.bisect()
        assert (second.culprit.name, second.culprit.verdict) == ("gelu_1", "isolated")
        assert "changed since the last command" in second.notes[0]
        assert session.notice_transform_edit() == ""  # noticed once


def test_an_interrupted_search_stops_its_compiles_ahead(traces, tmp_path, monkeypatch):
    """Ctrl-C while the compile lanes build ahead beside the chain (a transform slowed to 0.15 s a
    unit keeps them busy): no more units start, the prepare's thread is joined (the lanes are the
    next command's), and the session goes on."""
    import threading

    monkeypatch.setenv("TAPML_COMPILE_LANES", "2")
    planted = fault_transform(tmp_path, "scale", "gelu_1")
    slow = Path(planted.rpartition(":")[0])
    slow.write_text(slow.read_text() + "\n\ndef slow(mod):\n    import time\n    time.sleep(0.15)\n    return scale(mod)\n")
    with Session.open(traces.get("mlp"), transform=f"{slow}:slow", cache_dir=tmp_path / "cache") as session:
        def interrupted(self, beside):
            raise KeyboardInterrupt

        with monkeypatch.context() as patch:
            patch.setattr(IsolatedSweep, "follow", interrupted)
            with pytest.raises(KeyboardInterrupt):
                session.bisect()
        assert not any(t.name == "tapml-prepare" and t.is_alive() for t in threading.enumerate())
        units = len({op.name for op in session.ops if op.outputs})
        report = session.lanes.cache  # the prepare's queue was dropped, not built (the builder ahead of the
        assert report.compiled - report.compiled_ahead < units // 2  # search, at a low priority, is stopped apart)
        assert session.isolated(session.by_name["gelu_1"].index).failed  # the lanes serve the next command


def test_a_sweep_beside_compiles_ahead_still_finds_an_error_that_washes_out(traces, tmp_path, monkeypatch):
    """A real TVM 0.27 divergence that only the isolated sweep sees (the README's fp16 softmax
    under the fixed rule: within the looser propagated tolerance downstream), searched on a cold
    cache with compile lanes building ahead: the sweep follows the chain, which cannot clear the
    softmax's value by the isolated rule, so the sweep runs it alone and names it; the ops the
    chain did clear that way are not run alone."""
    monkeypatch.setenv("TAPML_COMPILE_LANES", "2")
    policy = TolerancePolicy(kind=PolicyKind.FIXED)
    with Session.open(traces.get("fp16_memory_attention"), cache_dir=tmp_path / "cache", policy=policy) as session:
        result = session.bisect()
        verdicts = session.isolated_verdicts
        below = {i for i in range(9) if session.ops[i].outputs}
        run_alone = {i for i in verdicts.cache if i < 9} - set(range(9 - 2, 9))  # (the culprit's neighbourhood: shown)
    assert (result.culprit.index, result.culprit.name, result.culprit.verdict) == (9, "_softmax", "isolated")
    assert below <= verdicts.screened | run_alone and len(run_alone) < len(below)


@pytest.mark.parametrize("first_done", ["chain", "sweep"])
def test_the_culprits_second_run_is_made_while_the_other_half_of_the_search_goes_on(traces, tmp_path, monkeypatch,
                                                                                    first_done):
    """Whichever of the chain and the sweep beside it stops first runs the op it stopped at alone
    once more while the other goes on (the chain's worker its first suspect, the sweep's lane its
    lowest failing op): the culprit's second run (nondeterministic or wrong) is then made already,
    and explaining it runs nothing more."""
    import time

    from tapml_dbg.engine import isolated as isolated_module
    from tapml_dbg.engine.isolated import IsolatedVerdicts
    from tapml_dbg.engine.verdicts import Verdicts
    from tapml_dbg.runtime.lanes import Lanes

    fill, explain, run, run_beside = IsolatedVerdicts.fill, Verdicts.explain, Lanes.run, Lanes.run_beside
    explaining, runs_explaining = [], []

    def slow_sweep(self, indices, plan, progress):
        fill(self, indices, plan, progress)
        if plan.bound is not None:  # the sweep beside the chain: still going when the chain stops
            time.sleep(1.0)

    def slow_chain(self, request, timeout_s=None):
        result = run_beside(self, request, timeout_s)
        if getattr(request, "screen", None) is not None:  # the chain: still going when the sweep stops
            time.sleep(1.0)
        return result

    def explained(self, verdict, upstream=None):
        explaining.append(True)
        try:
            return explain(self, verdict, upstream)
        finally:
            explaining.pop()

    def counted_run(self, *args, **kwargs):
        runs_explaining.extend(explaining[:1])
        return run(self, *args, **kwargs)

    if first_done == "chain":
        monkeypatch.setattr(IsolatedVerdicts, "fill", slow_sweep)
    else:
        monkeypatch.setattr(Lanes, "run_beside", slow_chain)
        # the sweep follows the chain a chunk at a time: small chunks, so that the one holding the fault is
        # passed (and swept) while the chain goes on collecting suspects, as on a model of many ops
        monkeypatch.setattr(isolated_module, "SWEEP_BATCH", 4)
    monkeypatch.setattr(Verdicts, "explain", explained)
    monkeypatch.setattr(Lanes, "run", counted_run)
    with Session.open(traces.get("mlp"), transform=fault_transform(tmp_path, "scale", "gelu_1")) as session:
        bisection = Bisection(session)
        culprit = bisection.run().culprit
        side_spare = bisection.beside.side_spare  # the chain's worker's run of its first suspect
        assert (side_spare is not None and side_spare[0] == culprit.index) == (first_done == "chain")
        assert not session.isolated_verdicts.spare_runs  # the spare run was used
    assert (culprit.name, culprit.verdict) == ("gelu_1", "isolated") and culprit.wrong is not None
    assert culprit.wrong != "nondeterministic" and not runs_explaining


def test_the_sweep_runs_alone_only_the_ops_whose_chained_values_the_isolated_screen_cannot_clear(traces, tmp_path):
    """A fault planted at op 13 of the mlp (fp32 on llvm): every value the chain computes below it clears
    the isolated screen too, so the sweep that follows the chain runs none of those ops alone (they are
    settled as cleared, `isolated.ChainLead`); the culprit is still judged alone, twice."""
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    with Session.open(traces.get("mlp"), transform=transform, cache_dir=tmp_path / "cache") as session:
        result = session.bisect()
        verdicts = session.isolated_verdicts
        below = {i for i in range(13) if session.ops[i].outputs}
        assert below and below <= verdicts.screened
        assert set(verdicts.cache) <= set(range(11, 16))  # the culprit and the neighbourhood shown around it
    assert (result.culprit.index, result.culprit.name, result.culprit.verdict) == (13, "gelu_1", "isolated")
