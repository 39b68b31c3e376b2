"""The trace's memo (runtime/run_memo.py): after a pass edit a search skips what earlier runs on the
trace established (isolated units that cleared, a chain's checkpoints), and names what a search
without it names; anything it cannot trust (another trace file, another rule, a damaged file) is run.
A generation searched again from the memo (the same step, op and first bad token) is the end of
tests/test_generation_report.py's first-bad-token test."""

from __future__ import annotations

import json
import os
import tempfile

import ml_dtypes
import numpy as np

import pytest

from conftest import fault_transform, run_cli
from tapml_dbg.engine.phases_fused import FusedPrefixes
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.compare import Tolerance, TolerancePolicy
from tapml_dbg.judge.noise_floor import NoiseFloor
from tapml_dbg.runtime import overlap, run_memo
from tapml_dbg.runtime.lanes import AHEAD_NICENESS, Lanes
from tapml_dbg.runtime.run_memo import RunMemo
from tapml_dbg.runtime.target import TargetSpec


def bisect(path, transform, cache, **options):
    """(culprit index, name, verdict, units the memo gave, notes) of one bisect in a fresh session."""
    with Session.open(path, transform=transform, cache_dir=cache, **options) as session:
        result = session.bisect()
        remembered = session.lanes.cache.remembered
    culprit = result.culprit
    return (culprit.index, culprit.name, str(culprit.verdict)) if culprit else None, remembered, result.notes


def checkpoints(cache) -> list:
    return sorted((cache / run_memo.MEMO_FOLDER).glob("*/chain-*.npz"))


def test_a_fault_moved_by_a_pass_edit_is_found_from_the_memo_as_without_it(traces, tmp_path, monkeypatch):
    """mlp: a fault at op 13 (gelu_1), then the pass edited to plant it at op 18 (addmm_3), then at op 2
    (addmm, before every checkpoint): each answer is the one a search without the memo gives; the
    later searches start their chain from a checkpoint and skip the isolated units already cleared. The
    searches without it (TAPML_MEMO=0) run in the same cache (its units compiled): they read none of
    the memo there and write none."""
    path, cache = traces.get("mlp"), tmp_path / "cache"
    moves = [fault_transform(tmp_path, "scale", op) for op in ("gelu_1", "addmm_3", "addmm")]
    answers = [bisect(path, transform, cache) for transform in moves]
    memo = _files(cache / run_memo.MEMO_FOLDER)
    monkeypatch.setenv("TAPML_MEMO", "0")
    plain = [bisect(path, transform, cache) for transform in moves]
    assert [answer[0] for answer in answers] == [answer[0] for answer in plain]
    assert [answer[0][:2] for answer in answers] == [(13, "gelu_1"), (18, "addmm_3"), (2, "addmm")]
    assert answers[0][1] == 0 and all(answer[1] == 0 for answer in plain)
    # the chain from its checkpoint at 8 (the ops below it: cleared by the isolated screen in the chain that
    # saved it, so not run alone either: isolated.ChainLead)
    assert answers[1][1] >= 8
    assert any("not made again" in note for note in answers[1][2])
    assert checkpoints(cache) and _files(cache / run_memo.MEMO_FOLDER) == memo


def _files(folder) -> dict:
    """Every file under `folder` with its size and modification time."""
    return {path: (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*") if path.is_file()}


def test_the_same_search_again_runs_almost_nothing(traces, tmp_path):
    path, cache = traces.get("mlp"), tmp_path / "cache"
    transform = fault_transform(tmp_path, "scale", "add_1")  # op 14
    first, second = bisect(path, transform, cache), bisect(path, transform, cache)
    assert first[0] == second[0] == (14, "add_1", "isolated")
    assert second[1] > first[1]


def test_another_trace_file_or_one_written_again_uses_none_of_it(traces, tmp_path):
    """The trace's identity is its file's: a copy, or the file written again, is another trace."""
    path, cache = traces.get("mlp"), tmp_path / "cache"
    transform = fault_transform(tmp_path, "scale", "add_1")
    bisect(path, transform, cache)
    copy = tmp_path / "copy.h5"
    copy.write_bytes(path.read_bytes())
    assert bisect(copy, transform, cache)[1] == 0  # another file
    bisect(copy, transform, cache)
    os.utime(copy, ns=(os.stat(copy).st_atime_ns, os.stat(copy).st_mtime_ns + 10**9))  # written again
    answer, remembered, _notes = bisect(copy, transform, cache)
    assert answer == (14, "add_1", "isolated") and remembered == 0


def test_a_stricter_propagated_rule_does_not_start_from_the_old_checkpoints(traces, tmp_path):
    """A x(1 + 1e-5) fault passes the default rule; with a propagated bound 50x stricter the chain
    must reach it and name it: checkpoints saved under the default rule past it are not used."""
    path, cache = traces.get("mlp"), tmp_path / "cache"
    transform = fault_transform(tmp_path, "scale", "addmm", scale="1.00001")
    clean = bisect(path, transform, cache)
    assert clean[0] is None and checkpoints(cache)
    strict = TolerancePolicy(noise=NoiseFloor(propagated_factor=0.02))
    assert bisect(path, transform, cache, policy=strict)[0] == (2, "addmm", "propagated")


def test_damaged_checkpoints_are_set_aside(traces, tmp_path):
    path, cache = traces.get("mlp"), tmp_path / "cache"
    transform = fault_transform(tmp_path, "scale", "add_2")  # op 20
    bisect(path, transform, cache)
    saved = checkpoints(cache)
    assert saved
    for checkpoint in saved:
        checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    assert bisect(path, transform, cache)[0] == (20, "add_2", "isolated")
    assert all(not checkpoint.exists() or checkpoint.stat().st_size > 100 for checkpoint in saved)


def test_a_checkpoint_says_which_ops_before_it_cleared_the_isolated_screen_under_its_rule(tmp_path):
    """What a chain resumed from a checkpoint logs for the ops it skips (runtime/chain_log.py): the names
    saved with it, for the same isolated rule only; nothing is known of a checkpoint saved without them."""
    trace = tmp_path / "t.h5"
    trace.write_bytes(b"x")
    memo = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    values = {"a": [np.ones(3, np.float32)]}
    assert memo.save("c" * 32, values, ("rule A", ["add", "gelu"])) and memo.save("n" * 32, values)
    again = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    assert again.cleared_before("c" * 32, "rule A") == ["add", "gelu"]
    assert again.cleared_before("c" * 32, "rule B") is None and again.cleared_before("n" * 32, "rule A") is None
    assert set(again.load("c" * 32)) == {"a"}  # the values read back as before


def test_checkpoint_values_come_back_bit_exact(tmp_path):
    trace = tmp_path / "t.h5"
    trace.write_bytes(b"x")
    memo = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    values = {"a": [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, dtype=np.int64)],
              "b": [np.array([1.5, -2.25], dtype=ml_dtypes.bfloat16)], "c": [np.array([True, False])]}
    assert memo.save("d" * 32, values)
    loaded = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec()).load("d" * 32)
    assert set(loaded) == set(values)
    for name, arrays in values.items():
        for want, got in zip(arrays, loaded[name]):
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
    assert not memo.save("e" * 32, {"big": [np.zeros(run_memo.CHECKPOINT_MAX_BYTES // 4 + 1, np.float32)]})


def test_cleared_units_survive_a_torn_line_and_the_memo_turns_off(tmp_path, monkeypatch):
    trace = tmp_path / "t.h5"
    trace.write_bytes(b"x")
    memo = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    unit = ("gelu", "k" * 32, [("op", "addmm", 0), ("value", np.ones(3, np.float32))], "rule")
    memo.add_cleared(memo.unit_digest(*unit))
    memo.close()
    (memo.folder / "cleared-torn.txt").write_text("b" * 32 + "\n" + "c" * 20)
    again = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    assert again.cleared(again.unit_digest(*unit)) and again.cleared("b" * 32) and not again.cleared("c" * 20)
    changed_value = (*unit[:2], [unit[2][0], ("value", np.full(3, 2, np.float32))], unit[3])
    assert not again.cleared(again.unit_digest(*changed_value))
    other = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec(target="llvm -mcpu=generic"))
    assert not other.cleared(other.unit_digest(*unit))  # another device: other digests
    monkeypatch.setenv("TAPML_MEMO", "0")
    assert RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec()) is None


@pytest.mark.parametrize("spacing_units", [(100, 8), (1000, 32)])
def test_checkpoints_are_spread_along_a_chain(spacing_units):
    units, every = spacing_units
    positions = sorted(run_memo.checkpoint_positions(units))
    assert positions[0] == every and all(b - a == every for a, b in zip(positions, positions[1:]))
    assert positions[-1] < units and len(positions) <= run_memo.CHECKPOINTS_PER_CHAIN


def test_a_chain_saves_within_its_own_budget(tmp_path, monkeypatch):
    """Each chain has CHAIN_CHECKPOINT_BYTES of its own: a worker's later chains save again."""
    monkeypatch.setattr(run_memo, "CHAIN_CHECKPOINT_BYTES", 1000)
    trace = tmp_path / "t.h5"
    trace.write_bytes(b"x")
    memo = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    values = {"a": [np.zeros(150, np.float32)]}  # 600 bytes
    memo.start_chain()
    assert memo.save("a" * 32, values) and not memo.save("b" * 32, values)
    memo.start_chain()
    assert memo.save("b" * 32, values)


def test_the_last_search_is_noted_per_device_and_a_damaged_note_is_none(tmp_path):
    trace = tmp_path / "t.h5"
    trace.write_bytes(b"x")
    memo = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec())
    assert memo.last_search() is None
    memo.note_search(chain_found=True)
    assert RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec()).last_search() == {"chain_found": True}
    other = RunMemo.open(str(tmp_path / "cache"), str(trace), TargetSpec(target="llvm -mcpu=generic"))
    assert other.last_search() is None  # another device's searches say nothing of this one
    memo.note_search(chain_found=False)
    assert memo.last_search() == {"chain_found": False}
    next(memo.folder.glob("search-*.json")).write_text("{torn")
    assert memo.last_search() is None


def test_on_two_cores_fused_probes_are_built_from_the_start_only_after_a_chain_found_nothing(traces, tmp_path,
                                                                                              monkeypatch):
    """Where the chain's worker and the sweep's lane take every core, a search builds its fused probes
    from the start only after a search on the trace whose chain found nothing; otherwise only once its
    own chain has found nothing (then at the search's priority: they run next), so a search whose
    chain finds the divergence builds none. With a core to spare, always from the start (here after
    those searches, in their cache: whatever the last search's chain found). The answers are the same
    either way. Every worker's log goes with its session, the builder's too."""
    probes, builds = [], []
    probes_ahead, build_ahead = FusedPrefixes.ahead, Lanes.build_ahead
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the workers' logs are made

    def made(self):
        requests = probes_ahead(self)
        probes.extend(requests)
        return requests

    def built(self, requests, niceness=AHEAD_NICENESS):
        builds[-1].append((any(request in probes for request in requests), niceness))
        return build_ahead(self, requests, niceness)

    monkeypatch.setattr(FusedPrefixes, "ahead", made)
    monkeypatch.setattr(Lanes, "build_ahead", built)
    path = traces.get("mlp")
    moves = [fault_transform(tmp_path, "scale", "gelu_1"), fault_transform(tmp_path, "scale", "addmm_3"), None,
             fault_transform(tmp_path, "scale", "gelu_1")]
    chain_only, from_start, at_chain_end = (False, AHEAD_NICENESS), (True, AHEAD_NICENESS), (True, 0)
    cache = tmp_path / "cache"
    for spare_cores, wanted in ((False, [[chain_only], [chain_only], [chain_only, at_chain_end], [from_start]]),
                                (True, [[from_start]] * 4)):
        monkeypatch.setattr(overlap, "AHEAD_SPARE_MIN_CORES", 1 if spare_cores else 10**6)
        answers = []
        builds.clear()
        for transform in moves:
            builds.append([])
            answer = bisect(path, transform, cache)[0]
            answers.append(answer[:2] if answer else None)
        assert answers == [(13, "gelu_1"), (18, "addmm_3"), None, (13, "gelu_1")]
        assert builds == wanted
    assert not list((tmp_path / "tmp").glob("tapml-worker-*.log"))


def test_a_bisect_by_the_cli_starts_from_what_a_bisect_by_the_api_established(traces, tmp_path):
    """The CLI sets variables of its own (TRANSFORMERS_VERBOSITY, to quiet transformers), and a user
    may set tapml's knobs of scheduling (the memo on by name, the side worker): they say nothing of
    what a unit computes, so its process uses the memo an API session left, as another API session
    would."""
    path, cache = traces.get("mlp"), tmp_path / "cache"
    bisect(path, fault_transform(tmp_path, "scale", "gelu_1"), cache)
    moved = fault_transform(tmp_path, "scale", "addmm_3")
    done = run_cli("bisect", str(path), "--transform", moved, "--json",
                   env={"TAPML_CACHE_DIR": str(cache), "TAPML_MEMO": "1", "TAPML_SIDE_LANE": "1"})
    answer = json.loads(done.stdout)
    assert answer["op"]["name"] == "addmm_3"
    assert any("not made again" in note for note in answer["notes"]), answer["notes"]


def test_a_cold_search_counts_no_run_as_remembered_even_when_its_chain_runs_again(traces, tmp_path):
    """Ops with a tolerance of their own are never cleared by the screen: the chain stops after
    CHAIN_SUSPECTS of them (from #10 on, past its checkpoint at 8), judges them (they pass) and runs
    again from its own checkpoint. That skip is this search's own, not an earlier run's: a cold bisect
    says nothing is remembered (it said 8 before); the same bisect again does."""
    from tapml_dbg.trace import TraceReader

    path, cache = traces.get("mlp"), tmp_path / "cache"
    names = [op["name"] for op in TraceReader(path).outline.ops][10:]
    policy = TolerancePolicy(by_op={name: Tolerance(1e-3, 1e-5) for name in names})
    first = bisect(path, None, cache, policy=policy)
    assert checkpoints(cache)
    assert first[0] is None and first[1] == 0, first
    assert not any("not made again" in note for note in first[2]), first[2]
    second = bisect(path, None, cache, policy=policy)
    assert second[1] > 0 and any("not made again" in note for note in second[2]), second
