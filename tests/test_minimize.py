"""`dump --minimize`: repros at the smallest input shapes that still fail, expected values from the host.

A planted elementwise fault shrinks to one element; the README's fp16 softmax (a real TVM 0.27
divergence, examples/fp16_memory_attention.py) shrinks to one short row that still sums wrong in fp16.
Every minimized repro runs in a fresh interpreter without torch or tapml-dbg and exits 1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import PLANTED_OP, fresh
import tapml_dbg.repro.minimize as minimize_module
from tapml_dbg.repro import dump_op
from tapml_dbg.repro.minimize import NotMinimizable, rebuild
from test_repro import in_parallel, run_repro

KIB = 1024
SMALL_REPRO_BYTES = 124 * KIB  # of which ~77 KiB are the repro's own code (tvm + numpy only; 11 of them portable/paged_kv.py); unminimized ~460 KiB
HANDFUL = 4  # elements a minimized elementwise repro may keep
SOFTMAX_PROBES = 12  # enough to cut the 4096-wide rows well down; the full search is in docs/dump-example.md


def _matmul(k_left: int, k_right: int):
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 3), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, w], attrs={"num_input": 2}, pure=True):
        out = builder.emit(relax.op.matmul(x, w), "mm")
        builder.emit_func_output(relax.Tuple([out]))
    return builder.get()["main"], [(2, k_left), (k_right, 3)]


def test_rebuild_gives_the_unit_at_new_shapes_or_refuses_them():
    func, shapes = _matmul(5, 5)
    small = rebuild(func, shapes)
    assert [tuple(int(d) for d in p.ty.shape.values) for p in small.params] == shapes
    assert [int(d) for d in small.body.body.fields[0].ty.shape.values] == [2, 3]
    func, shapes = _matmul(5, 4)  # k no longer agrees: TVM refuses, and says so as NotMinimizable
    with pytest.raises(NotMinimizable):
        rebuild(func, shapes)


def test_a_planted_elementwise_fault_minimizes_to_a_handful_of_elements(planted_mlp, tmp_path):
    session = fresh(planted_mlp)  # faults.py:scale on gelu_1 (x1.01)
    faulty = dump_op(session, PLANTED_OP, tmp_path / "faulty", minimize=True)
    shrunk = faulty.minimized
    assert shrunk.full_shapes == [(4, 32)] and shrunk.best is not None and shrunk.best.failed
    assert shrunk.elements <= HANDFUL, shrunk.shapes
    meta = json.loads((tmp_path / "faulty" / "meta.json").read_text())
    assert meta["minimized"]["minimized"] and meta["minimized"]["to"] == [list(s) for s in shrunk.shapes]
    assert meta["ops"][0]["inputs"][0]["shape"] == list(shrunk.shapes[0])
    readme = (tmp_path / "faulty" / "README.md").read_text()
    assert "**smallest failing shapes**: `addmm_2` " in readme and "minimized from (4, 32)" in readme
    assert "**worst element**" in readme
    passed = dump_op(session, "gelu", tmp_path / "clean", minimize=True)  # no fault there: nothing to minimize
    assert passed.minimized.best is None and "passes" in passed.minimized.note
    assert json.loads((tmp_path / "clean" / "meta.json").read_text())["ops"][0]["inputs"][0]["shape"] == [4, 32]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reproduced, clean_run = in_parallel(lambda: run_repro(tmp_path / "faulty", elsewhere),
                                        lambda: run_repro(tmp_path / "clean", elsewhere))
    assert reproduced.returncode == 1 and "(1, 1): FAIL" in reproduced.stdout, reproduced.stdout + reproduced.stderr
    assert clean_run.returncode == 0, clean_run.stdout + clean_run.stderr


def test_a_fused_unit_with_a_weight_minimizes_only_to_shapes_the_host_can_follow(planted_mlp, tmp_path):
    """`dump --ops addmm_2:gelu_1 --minimize`: the matmul's weight is not cut with the unit's inputs, so
    the host's float64 reference keeps the full width at some candidate shapes; such a candidate
    is not judged (it used to fail `worst element` with an IndexError) and the repro still fails."""
    session = fresh(planted_mlp)  # faults.py:scale on gelu_1 (x1.01)
    first = session.by_name[PLANTED_OP].index - 1
    result = dump_op(session, PLANTED_OP, tmp_path / "fused", ops=f"{first}:{first + 2}", minimize=True)
    shrunk = result.minimized
    assert shrunk.best is not None and shrunk.best.failed and shrunk.elements < sum(
        int(np.prod(s)) for s in shrunk.full_shapes)
    worst = json.loads((tmp_path / "fused" / "meta.json").read_text())["minimized"]["worst"]
    assert worst is not None and worst["output"] == 0
    reproduced = run_repro(tmp_path / "fused", tmp_path)
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr


def test_the_fp16_softmax_finding_minimizes_to_a_small_repro_that_still_fails(demo_session, tmp_path, monkeypatch):
    monkeypatch.setattr(minimize_module, "MAX_PROBES", SOFTMAX_PROBES)
    result = dump_op(fresh(demo_session), "_softmax", tmp_path / "softmax", minimize=True)
    shrunk = result.minimized
    (full,), (small,) = shrunk.full_shapes, shrunk.shapes
    assert full == (1, 8, 4096) and shrunk.best.failed and shrunk.probes <= SOFTMAX_PROBES
    assert small[-1] < full[-1] // 4 and np.prod(small) < np.prod(full) // 4, small
    assert result.bytes < SMALL_REPRO_BYTES
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reproduced = run_repro(tmp_path / "softmax", elsewhere)
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr
    assert f"float16 {tuple(small)}: FAIL" in reproduced.stdout
