"""bf16 end to end: transformers LMs cast to torch.bfloat16 record, bisect, generate, dump and fix on llvm.

bf16 is the dtype LLMs ship in. Tiny configs (1 layer, random weights, `.to(torch.bfloat16)`): the
narrow ones (width 32, MLP 64) are clean on llvm; a wide MLP (2048, as real LLMs' are wider still)
shows TVM 0.27's real bf16 bug: llvm's matmul sums bf16 products in bf16 (docs/coverage.md "bf16").
"""

from __future__ import annotations

import base64
import json

import ml_dtypes
import numpy as np
import pytest

from tapml_dbg.trace import source_graph as SG


# ------------------------------------------------------------------ the source graph's constants
def _graph_with_constant(value: dict) -> str:
    return json.dumps({"format": SG.FORMAT, "version": SG.VERSION, "nodes": [], "outputs": [], "ops": {},
                       "placeholders": [{"name": "c", "kind": SG.CONSTANT, "trace_name": "c", "val": None,
                                         "value": value}]})


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_a_bf16_constant_is_stored_as_its_raw_bits_and_read_back_bit_exact(dtype):
    """A buffer the import folds in (a bf16 model's `inv_freq`, say) kept as little-endian bits."""
    bits = np.array([0x3FC0, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001], dtype=np.uint16)
    if dtype != "bfloat16":
        bits = np.array([0x38, 0x80, 0x7F, 0x01, 0x00, 0xB8], dtype=np.uint8)
    array = bits.view(getattr(ml_dtypes, dtype)).reshape(2, 3)
    encoded = SG.encode_constant(array)
    assert base64.b64decode(encoded["data"]) == bits.astype(bits.dtype.newbyteorder("<")).tobytes()
    stored = SG.parse_source_graph(_graph_with_constant(encoded)).constants["c"]
    assert stored.dtype == array.dtype and stored.shape == (2, 3)
    assert stored.view(bits.dtype).tobytes() == array.view(bits.dtype).tobytes()  # NaN payloads and -0 too


def test_a_constant_whose_bits_do_not_fill_its_shape_is_refused():
    encoded = SG.encode_constant(np.zeros((2, 3), dtype=ml_dtypes.bfloat16))
    encoded["shape"] = [2, 4]
    with pytest.raises(Exception, match="does not match its shape"):
        SG.parse_source_graph(_graph_with_constant(encoded))
