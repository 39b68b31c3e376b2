"""Helper ops on the host: elementwise ones are TVM's exact bits, matmuls are the source's (torch)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tapml_dbg
from conftest import EXAMPLES
from tapml_dbg.record.recorder import record
from tapml_dbg.trace import TraceReader


def _same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_host_helpers_equal_tvm_except_matmuls_which_are_close(traces, tmp_path, monkeypatch):
    """Every elementwise/move helper equals tvm:llvm bit for bit; a matmul helper (torch's) and what
    reads it differ only by summation order. tiny_gpt2's host values are the suite's recording of it
    (the default mode, verify-first: past the first op of each kind, no value is checked against TVM
    while recording, so every one is checked here), cnn's a recording in verify-all mode (every
    elementwise value checked against TVM as it is recorded); each against a recording with TVM
    computing every helper (off)."""
    import tapml_dbg.record.host_ops as host_ops

    for example in ("tiny_gpt2", "cnn"):
        if example == "tiny_gpt2":
            host_trace, printed = traces.record(str(EXAMPLES / f"{example}.py"), name=example)  # traces.get's
            host_helpers = int(re.search(r"helper ops: (\d+) on the host", printed).group(1))
        else:
            host_trace = tmp_path / f"{example}_host.h5"
            monkeypatch.setattr(host_ops, "HOST_OPS_MODE", "verify-all")
            host_helpers = record(str(EXAMPLES / f"{example}.py"), host_trace).host_helpers
        monkeypatch.setattr(host_ops, "HOST_OPS_MODE", "off")
        by_tvm = record(str(EXAMPLES / f"{example}.py"), tmp_path / f"{example}_tvm.h5")
        assert host_helpers > 0 and by_tvm.host_helpers == 0
        with TraceReader(host_trace) as a, TraceReader(tmp_path / f"{example}_tvm.h5") as b:
            differ: set[str] = set()
            for op in a.outline.ops:
                pairs = list(zip(a.tensors.op_outputs(op["index"]), b.tensors.op_outputs(op["index"])))
                if all(_same_bits(x, y) for x, y in pairs):
                    continue
                differ.add(op["name"])
                assert op["relax_op"] == "relax.matmul" or set(op["inputs"]) & differ, op["name"]
                for x, y in pairs:
                    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * float(np.abs(y).max() or 1))
            if example == "tiny_gpt2":
                assert differ, "tiny_gpt2's addmm helpers are matmuls: torch and TVM sum in other orders"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64"])
@pytest.mark.parametrize("shape_a,shape_b", [((5, 37), (37, 9)), ((2, 3, 4, 70), (70, 6)), ((37,), (37, 5)),
                                             ((3, 37), (37,)), ((2, 1, 4, 8), (3, 8, 5))])
def test_host_matmul_is_torch_matmul(shape_a, shape_b, dtype):
    from tapml_dbg.record.host_ops import _HOST, _dtype, _to_torch
    from tapml_dbg.record.tensors import to_numpy

    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape_a) * 3).astype(_dtype(dtype))
    b = (rng.standard_normal(shape_b) * 3).astype(_dtype(dtype))
    want = to_numpy(torch.matmul(_to_torch(a), _to_torch(b)))
    out = _HOST["relax.matmul"]([a, b], None, want.shape, _dtype(dtype))
    assert out is not None and _same_bits(out, want)
    assert out.dtype == _dtype(dtype)


def test_fp16_matmul_accumulating_in_fp16_on_llvm_is_found_at_the_matmul(traces):
    """A real TVM 0.27 divergence: llvm's fp16 matmul sums in fp16 (torch sums in fp32). The
    addmm's matmul helper has the source's value, so bisect names it, not the bias add after it
    (with helpers computed by TVM, as before, the blame fell on `addmm_1`)."""
    trace = traces.get("fp16_wide_projection")  # `tapml-dbg record examples/fp16_wide_projection.py`, once a run
    with tapml_dbg.open(trace) as replay:
        found = replay.bisect().to_json()  # what `bisect --json` prints
    assert found["diverged"] and found["op"]["name"] == "addmm_1_p0"
    assert found["op"]["verdict"] == "isolated" and found["op"]["op"] == "aten.addmm.default"
    assert found["op"]["metrics"]["scale_rel_err"] > 0.015
