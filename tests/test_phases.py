"""The search's phases as pure decisions (engine/phases.py) and the runtime's overlap policy's own
decisions, checked without a worker, a compile or a trace."""

from __future__ import annotations

import ast
import random
import threading
import time
import types
from pathlib import Path

import pytest

import tapml_dbg
from tapml_dbg.engine.phases import (FollowStep, PrefixSearch, SearchRange, SearchTrace, first_failing,
                                     follow_chain, is_fusion_question, last_recorded, search_range)
from tapml_dbg.runtime.background import Background
from tapml_dbg.runtime.messages import ChainResult, UnitResult, UnitStatus
from tapml_dbg.runtime import overlap
from tapml_dbg.runtime.overlap import BesidePlan, ChainBesideSweep, SearchOverlap, SearchPlan, side_share


def _persistent(first_bad: int | None):
    return lambda k: first_bad is not None and k >= first_bad


@pytest.mark.parametrize("first_bad", [None, 0, 1, 7, 15, 16])
def test_prefix_search_finds_the_first_failing_prefix_in_log_probes(first_bad):
    """1 + ceil(log2(n)) probes, the end first (is anything wrong at all?), each asked once."""
    search = PrefixSearch(0, 16)
    asked = []
    while points := search.next():
        assert len(points) == 1 and points[0] not in asked
        asked.append(points[0])
        search.record(points, [_persistent(first_bad)(points[0])])
    assert search.done and search.answer == first_bad
    assert asked[0] == 16 and len(asked) <= 1 + 5
    assert search.trace.probes == [(k, _persistent(first_bad)(k)) for k in asked]


def test_prefix_search_of_an_empty_range_asks_nothing():
    search = PrefixSearch(5, 4)
    assert search.done and search.next(4) == [] and search.answer is None


@pytest.mark.parametrize("width", [2, 3, 8])
def test_a_wider_round_keeps_the_answer_and_the_probe_path(width):
    """Probing several points a round (speculatively, breadth first down the decision tree) ends where
    one a round ends, on the same path, in fewer rounds; a random (non-persistent) predicate too."""
    rng = random.Random(width)
    for _ in range(40):
        lo, hi = 0, rng.randrange(0, 40)
        truth = {k: rng.random() < 0.5 for k in range(lo, hi + 1)}
        plain = SearchTrace()
        expected = first_failing(lo, hi, truth.__getitem__, plain)
        search, rounds = PrefixSearch(lo, hi), 0
        while points := search.next(width):
            assert len(points) <= width and not set(points) & set(search.known)
            search.record(points, [truth[k] for k in points])
            rounds += 1
        assert search.answer == expected and search.trace.probes == plain.probes
        assert rounds <= len(plain.probes)


def test_following_the_chain_runs_only_what_it_passed_and_could_not_clear():
    """Ops are settled or run a whole chunk at a time once the chain has been past all of it; what the
    chain cleared by the isolated rule is settled without a run; the rest waits for the chain."""
    names = {i: f"op{i}" for i in range(10)}
    step = follow_chain(range(10), names.__getitem__, reached={"op0", "op1", "op2", "op3", "op4"},
                        cleared={"op0", "op2", "op3"}, done=False, cut=None, batch=4)
    assert step == FollowStep(cleared=(0, 2, 3), batches=((1,),), waiting=(4, 5, 6, 7, 8, 9))
    # the chain has ended: whatever it did not reach is run too, chunk by chunk; a cut drops what lies above it
    step = follow_chain(step.waiting, names.__getitem__, reached=set(), cleared={"op4"}, done=True, cut=8, batch=4)
    assert step == FollowStep(cleared=(4,), batches=((5, 6, 7), (8,)), waiting=())


def test_following_the_chain_is_the_same_requests_whatever_the_timing():
    """However far the chain has got at each look, the batches run are the same chunks."""
    names = {i: f"op{i}" for i in range(20)}
    cleared = {"op3", "op9"}
    for looks in ([20], [5, 13, 20], list(range(1, 21))):
        waiting, batches = tuple(range(20)), []
        for reached_up_to in looks:
            reached = {names[i] for i in range(reached_up_to)}
            step = follow_chain(waiting, names.__getitem__, reached, cleared, done=False, cut=None, batch=6)
            batches += step.batches
            waiting = step.waiting
        batches += follow_chain(waiting, names.__getitem__, set(), cleared, done=True, cut=None, batch=6).batches
        assert batches == [(0, 1, 2, 4, 5), (6, 7, 8, 10, 11), (12, 13, 14, 15, 16, 17), (18, 19)]


def test_the_search_range_is_the_recorded_prefix_or_the_capture_window():
    recorded = set(range(0, 7))
    assert last_recorded(0, 10, recorded) == 6 and last_recorded(8, 10, recorded) == 7
    assert search_range(7, None, recorded) == SearchRange(0, 6)
    incomplete = search_range(10, None, recorded)
    assert (incomplete.first, incomplete.last) == (0, 6) and "searched ops 0..6 only" in incomplete.notes[0]
    window = search_range(10, {"first": 2, "end": 6, "window": "2:6"}, set(range(2, 6)))
    assert (window.first, window.last) == (2, 5) and "recorded with --window 2:6" in window.notes[0]


def test_a_propagated_candidate_is_a_fusion_question_only_on_right_inputs():
    assert is_fusion_question(3, 3, [])  # the first op probed: its inputs are recorded values
    assert is_fusion_question(7, 3, [(10, True), (6, False), (7, True)])
    assert not is_fusion_question(7, 3, [(10, True), (7, True)])  # the probe before it never passed


# -- the runtime's overlap policy (runtime/overlap.py), over fake lanes: no worker runs -------------------
class _FakeLanes:
    """The `SideLanes` the policy uses, answering at once; what it was asked, in order."""

    def __init__(self, chained):
        self.chained, self.asked, self.counted_results, self.stopped = chained, [], [], False

    def run(self, request, timeout_s=None):
        self.asked.append(("lane", request))
        return UnitResult(UnitStatus.OK, outputs=[[0]])

    def run_beside(self, request, timeout_s=None):
        self.asked.append(("side", request))
        return self.chained if request == "chain" else UnitResult(UnitStatus.OK, outputs=[[0]])

    def counted(self, result, ran=True):
        self.counted_results.append(result)
        return result

    def stop_beside(self):
        self.stopped = True

    def side_interrupted(self):
        return self.stopped

    def found_nothing(self):
        self.asked.append(("found nothing", None))

    def chain_timeout(self, units):
        return 1.0


def _plan(left=(), **overrides):
    batch = types.SimpleNamespace(suspects=3)
    fields = dict(chain="chain", timeout=1.0, bound_of=lambda result: 5, spare_of=lambda result: (5, "spare 5"),
                  left=lambda: list(left), batch_of=lambda ops: (batch, list(ops)), lowest_failing=lambda: None)
    return BesidePlan(**{**fields, **overrides})


def test_side_share_is_the_upper_part_of_what_the_sweep_has_left():
    assert side_share(list(range(100))) == list(range(25, 100))
    assert side_share(list(range(80))) == []  # 60 ops: too few to be worth a run beside
    assert side_share(list(range(8)), share=0.5, least=2) == [4, 5, 6, 7]


def test_a_chain_that_found_nothing_takes_the_upper_part_of_the_sweep():
    """The chain's worker runs the upper share of the ops left as one batch once its chain found nothing;
    the sweep is bounded below that share; every result comes back counted."""
    lanes = _FakeLanes(ChainResult(UnitStatus.OK))
    seen = {}
    policy = ChainBesideSweep(lanes, _plan(left=range(100)), found_nothing=lanes.found_nothing)

    def sweep(view):
        policy.running.join()  # (a sweep slower than the chain)
        seen.update(bound=view.bound(), done=view.chain_done(), building=view.building())

    outcome = policy.run(sweep)
    assert seen == {"bound": 24, "done": True, "building": False}
    assert [kind for kind, _ in lanes.asked] == ["side", "found nothing", "side"]
    assert outcome.top[0] == list(range(25, 100)) and outcome.top[2] == 3
    assert outcome.side_spare is None and outcome.lane_spare is None and outcome.spare_units == 0
    assert outcome.chained in lanes.counted_results and outcome.top[1] in lanes.counted_results


def test_a_suspect_is_run_once_more_on_the_chain_worker_while_the_sweep_goes_on():
    """The chain stopped at a suspect while the sweep still runs: the chain's worker runs it alone once
    more (a second verdict's run, counted as such), and the sweep is bounded at the suspect."""
    lanes = _FakeLanes(ChainResult(UnitStatus.OK, suspects=["op5"], outputs=[[1]]))
    policy = ChainBesideSweep(lanes, _plan())
    bounds = []

    def sweep(view):
        policy.running.join()
        bounds.append(view.bound())

    outcome = policy.run(sweep)
    assert bounds == [5] and ("side", "spare 5") in lanes.asked
    assert outcome.side_spare[0] == 5 and outcome.spare_units == 1


def test_an_interrupted_sweep_kills_the_side_worker_and_cancels_the_builds_ahead():
    lanes = _FakeLanes(ChainResult(UnitStatus.OK))
    building = Background(lambda: None, "test-building")
    policy = ChainBesideSweep(lanes, _plan(), building=building)

    def sweep(view):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        policy.run(sweep)
    assert lanes.stopped and building.stop.is_set() and not policy.running.is_alive()



class _FakeSearchLanes(_FakeLanes):
    """`_FakeLanes` that build ahead too: what was built ahead (units, niceness), compiled ahead, stopped."""

    def __init__(self, chained):
        super().__init__(chained)
        self.built, self.compiled, self.stops = [], [], 0

    def build_ahead(self, requests, niceness=10):
        self.built.append((list(requests), niceness))

    def stop_ahead(self):
        self.stops += 1

    def compile_ahead(self, units, wait=True):
        self.compiled.append((list(units), wait))
        return None


class _FakeMemo:
    def __init__(self, last=None):
        self.last, self.noted, self.begun = last, [], 0

    def begin_search(self):
        self.begun += 1

    def last_search(self):
        return self.last

    def note_search(self, chain_found):
        self.noted.append(chain_found)


def _search(lanes, memo, found: bool) -> None:
    """One search through the policy, as `Bisection.search` makes it: the chain beside a sweep, then its end."""
    with SearchOverlap(lanes, SearchPlan(probes_ahead=["probe"], chain_units=["c1", "c2"]), memo) as overlap:
        overlap.beside_sweep(_plan(), lambda view: None)
        overlap.chain_done(found=found)


@pytest.mark.parametrize("found", [True, False])
def test_on_two_busy_cores_a_search_holds_its_fused_probes_until_its_chain_found_nothing(monkeypatch, found):
    """Without a spare core and without a note that the last chain found nothing, the chain's units are
    built ahead from its end and the probes held: built at the search's priority once the chain's first
    run found nothing, never when it found the divergence (building ahead then stops). The chain's units
    are compiled ahead beside the chain; the search is begun and its finding noted in the memo."""
    monkeypatch.setattr(overlap, "AHEAD_SPARE_MIN_CORES", 10**6)
    lanes = _FakeSearchLanes(ChainResult(UnitStatus.OK, suspects=["op5"], outputs=[[1]]) if found
                             else ChainResult(UnitStatus.OK))
    memo = _FakeMemo()
    _search(lanes, memo, found)
    assert memo.begun == 1 and memo.noted == [found]
    assert lanes.compiled == [(["c1", "c2"], False)]
    held = [] if found else [(["probe"], 0)]
    assert lanes.built == [(["c2", "c1"], 10)] + held
    assert lanes.stops == (2 if found else 1)  # at the chain's end when it found, and at the search's end


@pytest.mark.parametrize("spare_cores, last", [(True, None), (False, {"chain_found": False})])
def test_fused_probes_are_built_from_the_start_with_a_spare_core_or_after_a_chain_that_found_nothing(
        monkeypatch, spare_cores, last):
    monkeypatch.setattr(overlap, "AHEAD_SPARE_MIN_CORES", 1 if spare_cores else 10**6)
    lanes = _FakeSearchLanes(ChainResult(UnitStatus.OK))
    _search(lanes, _FakeMemo(last), found=False)
    assert lanes.built == [(["probe", "c2", "c1"], 10)]  # nothing held, nothing built again at the chain's end


def test_a_sweep_waiting_for_the_chain_wakes_as_soon_as_the_chain_is_back(monkeypatch):
    """The sweep's wait polls the chain's log (written by another process), but the chain's return ends
    it at once, not a poll later."""
    monkeypatch.setattr(overlap, "FOLLOW_POLL_S", 60.0)
    release = threading.Event()
    lanes = _FakeLanes(ChainResult(UnitStatus.OK))
    run_beside = lanes.run_beside

    def slow_chain(request, timeout_s=None):
        release.wait(10)
        return run_beside(request, timeout_s)

    lanes.run_beside = slow_chain
    waited = []

    def sweep(view):
        assert not view.chain_done()
        threading.Timer(0.05, release.set).start()
        started = time.monotonic()
        view.wait()
        waited.append((time.monotonic() - started, view.chain_done()))

    ChainBesideSweep(lanes, _plan()).run(sweep)
    assert waited[0][0] < 10 and waited[0][1]

def test_the_engine_never_waits_nor_shares_state_through_closures():
    """What waits (a sweep following a chain) and what runs beside what is the runtime's: no `time.sleep`
    and no `nonlocal` state anywhere in engine/; the phases' decisions import nothing that runs."""
    engine = Path(tapml_dbg.__file__).parent / "engine"
    wrong = []
    for path in sorted(engine.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Nonlocal):
                wrong.append(f"{path.name}:{node.lineno} nonlocal")
            if isinstance(node, ast.ImportFrom) and node.module == "time" or \
                    isinstance(node, ast.Attribute) and node.attr == "sleep":
                wrong.append(f"{path.name}:{node.lineno} sleeps")
    assert not wrong, wrong
    imported = {node.module for node in ast.walk(ast.parse((engine / "phases.py").read_text()))
                if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "typing"}, imported
