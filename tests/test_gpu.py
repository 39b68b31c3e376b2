"""CUDA replay on a real GPU; skipped cleanly where there is none (CI has none)."""

from __future__ import annotations

import pytest

from conftest import fault_transform
from tapml_dbg.engine.session import Session


def _has_cuda() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU on this machine")


def test_planted_fault_found_on_cuda(traces, tmp_path):
    with Session.open(traces.get("mlp"), target="cuda", transform=fault_transform(tmp_path, "scale", "gelu_1")) as s:
        result = s.bisect()
    assert result.diverged and result.culprit.name == "gelu_1" and result.culprit.verdict == "isolated"


def test_every_op_has_device_code_on_cuda(traces):
    with Session.open(traces.get("cnn"), target="cuda") as session:
        assert session.compile_all().failed == 0


def test_gpt2_gelu_pow_nan_on_cuda(traces):
    """A real TVM 0.27 CUDA divergence: pow(x, 3.0) is NaN for negative x (gelu_new)."""
    with Session.open(traces.get("tiny_gpt2"), target="cuda") as session:
        result = session.bisect()
    assert result.diverged and result.culprit.op == "aten.pow.Tensor_Scalar"
    assert result.culprit.metrics.nan_mismatch > 0
