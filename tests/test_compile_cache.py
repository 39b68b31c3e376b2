"""The compile cache keys a unit by what is compiled (its structure after the user's transform),
compile lanes build units on the host while a run lane runs them, and a corrupt recorded value
read by a worker reaches the user as the trace's own error.

Compiles are counted by the session's `CacheReport` (what each worker said it built or reused),
never by timing. One mlp trace (examples/mlp.py: three identical blocks) serves every test.
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import pytest

from conftest import fault_transform
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import TraceError
from tapml_dbg.judge.verdict import PROPAGATED
from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.model.units import build_unit
from tapml_dbg import portable, settings
from tapml_dbg.runtime import compile_cache, lanes
from tapml_dbg.runtime.target import parse_target
from damage_trace import flip_dataset_bit

LOCK_WAIT_S = 1.0  # long enough for the waiter to reach the lock
GELU_OPS = ("gelu", "gelu_1", "gelu_2")  # the same op in blocks.0, .1 and .2 (other variable names)

# a pass that touches one op kind: every relax.nn.gelu result is scaled
GELU_PASS = '''
from tvm import relax


def scale_gelu(mod):
    @relax.expr_functor.mutator
    class Scale(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.nn.gelu":
                inner = self.builder_.emit(value)
                value = relax.op.multiply(inner, relax.const({factor}, "float32"))
            self.set_var_remap(binding.var, self.builder_.emit(value, binding.var.name))

    mutator = Scale(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()
'''


@pytest.fixture(scope="module")
def mlp(traces):
    return traces.get("mlp")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def clean(mlp, cache):
    """The mlp on llvm, no transform, over the module's cache (tests count compiles as differences)."""
    with Session.open(mlp, cache_dir=cache) as session:
        yield session


def _all_ops(session) -> dict[int, str]:
    verdicts = session.verdicts.isolated_many(range(len(session.ops)))
    return {index: verdict.status for index, verdict in verdicts.items()}


def _gelu_unit(session, name: str = "gelu") -> dict:
    func, _spec = build_unit(session.main, [name], [name])
    return function_to_json(func)


def test_the_same_op_in_two_layers_compiles_once(clean):
    report = clean.lanes.cache
    first, second = (clean.by_name[name].index for name in GELU_OPS[:2])
    assert clean.isolated(first).passed
    keys, compiled, reused = len(report.keys), report.compiled, report.reused
    assert clean.isolated(second).passed  # blocks.1's gelu: other names, the same structure
    assert (len(report.keys), report.compiled, report.reused) == (keys, compiled, reused + 1)
    statuses = _all_ops(clean)
    assert set(statuses.values()) == {"pass"}
    assert report.compiled == len(report.keys) == len(set(report.compiled_keys))  # each key built once
    assert report.compiled < report.compiled + report.reused == len(statuses)  # fewer builds than ops


def test_a_pass_that_touches_one_op_kind_recompiles_only_those_units(mlp, cache, clean, tmp_path):
    assert set(_all_ops(clean).values()) == {"pass"}  # every unit of the model is in the cache
    transform = tmp_path / "gelu_pass.py"
    transform.write_text(GELU_PASS.replace("{factor}", "1.01"))
    spec = f"{transform}:scale_gelu"
    with Session.open(mlp, transform=spec, cache_dir=cache) as session:
        statuses = _all_ops(session)
        gelus = {session.by_name[name].index for name in GELU_OPS}
        assert {i for i, status in statuses.items() if status != "pass"} == gelus
        # the three gelus are one unit after the pass too: one build, every other unit from the cache
        assert session.lanes.cache.compiled == 1
        assert session.lanes.cache.reused == len(statuses) - 1
    built = compile_cache.compile_unit(_gelu_unit(clean, "gelu_2"), "llvm", spec, cache)
    transform.write_text("# an edit that changes no unit\n" + transform.read_text())
    again = compile_cache.compile_unit(_gelu_unit(clean, "gelu_2"), "llvm", spec, cache)
    assert built.cached and again.cached and again.key == built.key


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(clean, tmp_path):
    unit, folder = _gelu_unit(clean), tmp_path / "cache"
    built = compile_cache.compile_unit(unit, "llvm", None, folder)
    assert not built.cached and compile_cache.compile_unit(unit, "llvm", None, folder).cached
    data = bytearray(built.path.read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)  # the second half zeroed: a torn write
    built.path.write_bytes(bytes(data))
    rebuilt = compile_cache.compile_unit(unit, "llvm", None, folder)
    assert not rebuilt.cached and rebuilt.key == built.key and rebuilt.path.read_bytes() != bytes(data)
    (folder / f"{built.key}.json").write_text("{not json")
    assert not compile_cache.compile_unit(unit, "llvm", None, folder).cached
    assert compile_cache.compile_unit(unit, "llvm", None, folder).cached  # and trusted once whole again


def test_two_workers_building_the_same_key_build_it_once(clean, tmp_path):
    """A worker that needs a key another one is building waits for its lock, then reuses the library."""
    unit, folder = _gelu_unit(clean), tmp_path / "cache"
    target = parse_target("llvm")
    transformed = compile_cache._transformed(unit, None)
    entry = compile_cache.CacheEntry(folder, compile_cache.cache_key(transformed.result, target))
    results = []
    waiter = threading.Thread(target=lambda: results.append(compile_cache.compile_unit(unit, "llvm", None, folder)))
    with entry.locked():  # this "worker" is building the key
        waiter.start()
        waiter.join(LOCK_WAIT_S)
        assert waiter.is_alive() and not results  # the other one waits for the lock ...
        entry.store(portable.build(transformed.original, target))
    waiter.join()
    assert results[0].cached and results[0].path == entry.library  # ... and loads what was built


def test_a_compile_lane_building_ahead_leaves_a_key_another_worker_is_building_to_it(clean, tmp_path):
    """Units of different ops often share a key: a lane that waited for another's build of it sat
    idle while the chain waited for units no lane had got to yet."""
    unit, folder = _gelu_unit(clean), tmp_path / "cache"
    target = parse_target("llvm")
    entry = compile_cache.CacheEntry(folder, compile_cache.cache_key(compile_cache._transformed(unit, None).result,
                                                                     target))
    with entry.locked():  # another worker is building the key
        ahead = compile_cache.compile_unit(unit, "llvm", None, folder, wait=False)
    assert ahead.elsewhere and ahead.key == entry.key and not ahead.cached and not entry.library.exists()
    built = compile_cache.compile_unit(unit, "llvm", None, folder, wait=False)  # nobody holds it: built here
    assert not built.elsewhere and not built.cached and entry.valid()


def test_compile_lanes_give_the_run_lanes_answers(mlp, tmp_path, monkeypatch):
    """Units compiled on two compile lanes and run on one lane: every op its own verdict."""
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    monkeypatch.setenv(settings.COMPILE_LANES, "2")
    monkeypatch.setattr(lanes, "UNITS_PER_COMPILE_LANE", 4)  # 12 units are enough for two lanes
    with Session.open(mlp, transform=transform, cache_dir=tmp_path / "cache") as session:
        assert session.lanes.compile_lanes == 2
        ops = range(8, 20)
        verdicts = session.verdicts.isolated_many(ops)
        assert all(units > 0 for units in session.lanes.compile_pool.units)  # both lanes compiled
        assert session.lanes.cache.compiled == len(session.lanes.cache.keys) < len(ops)  # blocks.1 and .2 share units
        assert session.pool.units[0] == len(ops)  # and the run lane ran them all
    assert {i: v.status for i, v in verdicts.items()} == {i: "fail" if i == 13 else "pass" for i in ops}


def test_a_corrupt_value_read_by_the_worker_is_the_traces_error(mlp, tmp_path):
    """Before: the worker's TraceError became an `error` verdict of the op that read the value."""
    path = tmp_path / "flipped.h5"
    path.write_bytes(mlp.read_bytes())
    flip_dataset_bit(path, "ops/12/0")  # addmm_2: read by gelu_1 (op 13) as its input
    with Session.open(path, cache_dir=tmp_path / "cache") as session:
        with pytest.raises(TraceError, match=r"op 12's recorded output 0 is corrupt \(checksum mismatch\)"):
            session.isolated(13)


def test_a_chain_of_one_op_units_gives_the_fused_runs_values(mlp, cache, tmp_path):
    """The propagated run of the whole model from per-op kernels (shared between layers) instead of
    one fused function: the same target values, the first divergent op the planted one."""
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    with Session.open(mlp, transform=transform, cache_dir=cache) as session:
        indices = [op.index for op in session.ops if op.outputs]
        chain = session.requests.chain(indices)
        session.lanes.prepare(chain.units)
        assert session.lanes.cache.compiled + session.lanes.cache.reused == len(indices)
        result = session.lanes.run(chain)
        assert result.ok and result.cached  # every unit was prepared: the chain only ran
        names = [session.ops[i].name for i in indices]
        fused = session.lanes.run(session.requests.ops_request(names, names))
        for chained, whole in zip(result.outputs, fused.outputs):
            for a, b in zip(chained, whole):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        failing = [i for i, outputs in zip(indices, result.outputs)
                   if not session.verdicts.judge(i, PROPAGATED, result, outputs).passed]
        assert failing and failing[0] == session.by_name["gelu_1"].index


def test_the_unit_index_is_found_without_tvm_and_keeps_its_version_inside(tmp_path):
    """The index's file is named by target and transform text only (a session checks `exists` at
    open, before importing TVM); an index written under another TVM or recipe reads as empty."""
    CacheEntry, UnitIndex = compile_cache.CacheEntry, compile_cache.UnitIndex
    library = tmp_path / "k1.so"
    library.write_bytes(b"lib")
    (tmp_path / "k1.json").write_text(json.dumps({"size": 3, "sha256": hashlib.sha256(b"lib").hexdigest()}))
    assert CacheEntry(tmp_path, "k1").valid()
    unit = {"name": "add", "body": [1, 2]}
    index = UnitIndex(tmp_path, "llvm", None)
    assert not index.exists() and not index.cached(unit)
    index.record([(unit, "k1")])
    assert index.exists() and UnitIndex(tmp_path, "llvm", None).cached(unit)
    assert not UnitIndex(tmp_path, "cuda", None).exists()  # another target: another file
    data = json.loads(index.path.read_text())
    index.path.write_text(json.dumps({**data, "version": "tvm 0.1, recipe 1"}))
    assert not UnitIndex(tmp_path, "llvm", None).cached(unit)


COUNTING_PASS = '''
from pathlib import Path


def counted(mod):
    with open(Path(__file__).with_suffix(".calls"), "a") as calls:
        calls.write("applied\\n")
    return mod
'''


def test_a_key_one_worker_computed_is_the_next_ones_without_the_transform(mlp, tmp_path, monkeypatch):
    """The session's key ledger: the side worker runs a unit lane 0 ran by the key lane 0 computed,
    without applying the pass again; a worker of another environment, or once the pass's text
    changed, computes its own."""
    transform, calls = tmp_path / "counting.py", tmp_path / "counting.calls"
    transform.write_text(COUNTING_PASS)
    with Session.open(mlp, transform=f"{transform}:counted", cache_dir=tmp_path / "cache") as session:
        request = session.requests.isolated(5)
        first = session.lanes.run(request)
        assert first.ok and calls.read_text().count("applied") == 1
        second = session.lanes.run_beside(request)
        assert second.ok and second.key == first.key and second.cached
        assert calls.read_text().count("applied") == 1  # the ledger's key: the pass did not run
        np.testing.assert_array_equal(second.outputs[0][0], first.outputs[0][0])
        monkeypatch.setenv("TAPML_TEST_LEDGER_SCOPE", "another")  # a pass may read the environment
        session.lanes.stop_beside()  # its next worker starts with this environment
        third = session.lanes.run_beside(request)
        assert third.ok and calls.read_text().count("applied") == 2
        transform.write_text(COUNTING_PASS + "\n# edited\n")
        fourth = session.lanes.run_beside(request)
        assert fourth.ok and calls.read_text().count("applied") == 3  # another text: not the old key


def test_a_chain_sends_each_structure_once_and_names_count_under_a_transform(clean):
    """The units of one structure in a chain (gelu in every block) go to the worker as one JSON
    object with their id (pickled once, keyed once); under a transform, which may read names, each
    op's own JSON goes, with the id of its own names."""
    indices = [clean.by_name[name].index for name in GELU_OPS]
    chain = clean.requests.chain(indices)
    sent = compile_cache.shared_units(chain, None)
    assert len({id(unit.unit_json) for unit in sent.units}) == 1
    assert {unit.unit_id for unit in sent.units} == {compile_cache.unit_id(chain.units[0].unit_json, None)}
    assert [unit.inputs for unit in sent.units] == [unit.inputs for unit in chain.units]  # each op's own inputs
    named = compile_cache.shared_units(chain, "a_pass.py:fix")
    assert [unit.unit_json for unit in named.units] == [unit.unit_json for unit in chain.units]
    assert len({unit.unit_id for unit in named.units}) == len(GELU_OPS)
    result = clean.lanes.run(chain)
    assert result.ok and len(result.outputs) == len(GELU_OPS)


def test_the_link_writes_the_bytes_tvms_default_link_writes(clean, tmp_path, monkeypatch):
    """A unit's library linked by the C driver (compile_cache._link_options) is TVM's default g++
    link, byte for byte; with $CXX set, TVM's own choice is used."""
    import shutil as _shutil

    if not (_shutil.which("gcc") and _shutil.which("g++")):
        pytest.skip("needs gcc and g++")
    module = compile_cache._transformed(_gelu_unit(clean), None).original
    executable = portable.build(module, parse_target("llvm"))
    ours, default = tmp_path / "ours.so", tmp_path / "default.so"
    executable.export_library(str(ours), **compile_cache._link_options(".so"))
    executable.export_library(str(default))
    assert compile_cache._link_options(".so") and ours.read_bytes() == default.read_bytes()
    monkeypatch.setenv("CXX", "g++")
    assert compile_cache._link_options(".so") == {}
    assert compile_cache._link_options(".tar") == {}


def _random_inputs(unit_json: dict, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(param["shape"]).astype(param["dtype"]) for param in unit_json["params"]]


def test_units_built_together_share_one_library_and_compute_what_each_built_alone_computes(clean, tmp_path):
    """`build_together`: one build and one link for several units, a key's entry per unit (hard links to
    one file, each checked as any entry), and each unit's entry gives the bytes its own library gives."""
    units = {}
    for op in clean.ops:
        unit_json, _spec = clean.requests.one_op_unit(op.name)
        if op.outputs and all(param["dtype"].startswith("float") for param in unit_json["params"]):
            units.setdefault(compile_cache.unit_id(unit_json, None), unit_json)
    units = list(units.values())
    together, alone = tmp_path / "together", tmp_path / "alone"
    built = compile_cache.build_together(units, "llvm", None, together)
    assert len(built) == len(units) > 2
    assert compile_cache.build_together(units, "llvm", None, together) == set()  # all there: nothing to build
    runner = portable.Runner("llvm")
    for number, unit_json in enumerate(units):
        mine = compile_cache.compile_unit(unit_json, "llvm", None, together)
        own = compile_cache.compile_unit(unit_json, "llvm", None, alone)
        assert mine.cached and not own.cached and mine.key == own.key and mine.key in built
        assert mine.path.stat().st_ino == (together / f"{next(iter(built))}.so").stat().st_ino  # one file
        inputs = _random_inputs(unit_json, number)
        ours = portable.flatten(runner.invoke(runner.load(mine.path), inputs))
        theirs = portable.flatten(runner.invoke(runner.load(own.path), inputs))
        assert [a.tobytes() for a in ours] == [b.tobytes() for b in theirs]


def test_a_unit_another_worker_is_building_is_left_out_of_a_build_together(clean, tmp_path):
    """No waiting for a lock there: the key (and every key of its lock's stripe) is left to its builder."""
    units = [clean.requests.one_op_unit(op.name)[0] for op in clean.ops if op.outputs]
    keys = [compile_cache.cache_key(compile_cache._transformed(unit, None).result, parse_target("llvm"))
            for unit in units]
    distinct = list(dict.fromkeys(keys))
    assert len(distinct) >= 4
    busy = compile_cache.CacheEntry(tmp_path, distinct[0])
    with busy.locked():  # another worker is building this key
        built = compile_cache.build_together(units, "llvm", None, tmp_path)
    striped = {key for key in distinct if compile_cache.CacheEntry(tmp_path, key).lock_path == busy.lock_path}
    assert built == set(distinct) - striped and not busy.library.exists()
    assert compile_cache.build_together(units[:1], "llvm", None, tmp_path / "one") == set()  # one alone: not here
    assert compile_cache.build_together(units, "cuda", None, tmp_path / "gpu") == set()  # host targets only


def test_a_library_that_fails_to_build_together_leaves_each_unit_to_its_own_build(clean, tmp_path, monkeypatch):
    """One unit's compile error spoils a library built together: nothing of it is stored (no key points
    at it), and each unit then builds alone, so the error stays that unit's own."""
    units = [clean.requests.one_op_unit(op.name)[0] for op in clean.ops if op.outputs][:6]

    def failing(*_args, **_kwargs):
        raise RuntimeError("a codegen error in one of the units")

    monkeypatch.setattr(compile_cache, "_store_together", failing)
    assert compile_cache.build_together(units, "llvm", None, tmp_path) == set()
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob("*.json"))
    monkeypatch.undo()
    alone = compile_cache.compile_unit(units[0], "llvm", None, tmp_path)
    assert not alone.cached and alone.path.is_file()



def test_a_chains_worker_builds_together_only_where_no_compile_lanes_build_side_by_side(mlp, tmp_path):
    """With compile lanes, a chain's units are built one per lane in parallel: one worker's batch of 32
    would serialize them. The builder ahead, one worker by nature, is not told otherwise."""
    from tapml_dbg.runtime.messages import WorkerConfig
    from tapml_dbg.runtime.target import TargetSpec

    with_lanes = lanes.Lanes(str(mlp), TargetSpec(), str(tmp_path), compile_lanes=2)
    without = lanes.Lanes(str(mlp), TargetSpec(), str(tmp_path), compile_lanes=0)
    try:
        assert not with_lanes.pool.config.together and without.pool.config.together
        assert WorkerConfig.from_json(with_lanes.pool.config.to_json()).together is False
    finally:
        with_lanes.close()
        without.close()
