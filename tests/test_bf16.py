"""bf16 end to end: transformers LMs cast to torch.bfloat16 record, bisect, generate, dump and fix on llvm.

bf16 is the dtype LLMs ship in. Tiny configs (examples/family_lms.py: 1 layer, random weights,
`.to(torch.bfloat16)`): the narrow ones (width 32, MLP 64) are clean on llvm; a wide MLP (2048, as
real LLMs' are wider still) shows TVM 0.27's real bf16 bug: llvm's matmul sums bf16 products in bf16
(docs/coverage.md "bf16"). Its other two, layer_norm and power that do not build in bf16 on llvm, and
their fix: tests/test_family_coverage.py's bf16 GPT-2 cell.
"""

from __future__ import annotations

import base64
import io
import json

import ml_dtypes
import numpy as np
import pytest
import torch

import tapml_dbg
from conftest import EXAMPLES, fault_transform, run_cli
from tapml_dbg import portable as lib
from tapml_dbg.engine.session import Session
from tapml_dbg.portable import load_function
from tapml_dbg.repro import dump_op
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace import source_graph as SG

MODELS = EXAMPLES / "family_lms.py"  # build_FAMILY_bf16: test_causal_lm's tiny configs cast to bfloat16
SEQ, VOCAB = 6, 64  # its prompt's positions and vocabulary
# bf16 generation, one family of each kind: Qwen2 is Llama with q/k/v biases (every op and dtype a bf16
# Llama records, and a bf16 addmm); Gemma scales its embedding, normalizes by (1 + w) and gates with gelu
GENERATED = ["qwen2", "gemma"]


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


# ------------------------------------------------------------------ bf16 transformers LMs
def _generated(traces, family: str):
    """`record FAMILY_bf16 --generate 2` (a prefill of 6 positions + 2 decode steps), once for the run:
    (trace, what the record printed)."""
    return traces.record(f"{MODELS}:build_{family}_bf16", "--generate", "2", name=f"bf16_{family}_gen")


def _prefill_logits(reader) -> dict:
    """The prefill's lm_head output: the logits of every prompt position (the steps keep the last one's)."""
    return [op for op in reader.outline.ops if op["step"] == 0 and op["layer"] == "lm_head"][-1]


@pytest.mark.parametrize("family", GENERATED)
def test_a_bf16_lm_records_its_logits_bit_exact_generates_and_every_step_bisects_clean(traces, family):
    """`record --generate 2` of the bf16 LM: params stored as bf16 (raw bits); the prefill's logits are the
    eager model's own (`model(ids).logits`, bit for bit); the prefill and both decode steps clean on llvm,
    every step's token the source's."""
    trace, printed = _generated(traces, family)
    assert "a prefill of 6 positions + 2 decode steps" in printed
    model, (ids,) = load_function(str(MODELS), f"build_{family}_bf16")()
    with torch.no_grad():
        expected = model(ids).logits
    with TraceReader(trace) as reader:
        assert reader.complete
        assert {reader.tensors.param(name).dtype for name in reader.outline.param_names} == {np.dtype(ml_dtypes.bfloat16)}
        (logits,) = reader.tensors.op_outputs(_prefill_logits(reader)["index"])
    assert logits.dtype == ml_dtypes.bfloat16 and logits.shape == (1, SEQ, VOCAB)
    assert logits.view(np.uint16).tobytes() == expected.view(torch.int16).numpy().tobytes()
    with Session.open(trace) as session:
        found = session.bisect()
    assert not found.diverged, found.culprit
    assert len(found.tokens.steps) == 3 and found.first_bad_token is None
    assert all(step.source == step.target for step in found.tokens.steps)


def test_the_source_runner_reruns_bf16_ops_bit_exact_and_in_float64(traces):
    """The host runner's two runs of a bf16 trace: in the recorded dtype, every op's value bit for bit;
    promoted, float64 within bf16's rounding of it (the reference the noise floor judges against)."""
    trace, _ = _generated(traces, "qwen2")
    with Session.open(trace) as session:
        runner = session.reference.runner
        held = [op for op in session.ops if runner.holds(op.name) and op.outputs[0].dtype == "bfloat16"]
        assert len(held) > 50
        for op in held:
            recorded = session.source_values(op.index)[0]
            again = runner.op_value(op)[0]
            assert again.dtype == ml_dtypes.bfloat16 and again.tobytes() == recorded.tobytes(), op.name
            wide = runner.op_value(op, promote=True)[0]
            assert wide.dtype == np.float64, op.name
            scale = max(float(np.abs(wide).max()), 1e-30)
            assert np.abs(wide - recorded.astype(np.float64)).max() <= 2 ** -7 * scale, op.name  # one bf16 ulp
        logits = session.reference.propagated(session.ops[-1].index).value(0)  # the whole generation in float64
        assert logits.dtype == np.float64
        recorded = session.source_values(session.ops[-1].index)[0].astype(np.float64)
        assert np.abs(logits - recorded).max() <= 0.05 * np.abs(logits).max()


def test_the_host_recomputes_a_bf16_matmul_bit_exact_as_llvm_sums_it():
    """The `precision` evidence: TVM 0.27 widens each step of a bf16 sum to float32 (acc + a * b) and
    rounds once; the host's recipe (host/low_precision.py) gives llvm's value bit for bit."""
    import tvm
    from tvm import relax

    from tapml_dbg.host.low_precision import recompute_aten
    from tapml_dbg.host.torch_values import to_numpy, to_torch

    rng = np.random.default_rng(0)
    a = np.abs(rng.standard_normal((6, 512))).astype(ml_dtypes.bfloat16)  # one sign: the error adds up
    b = (rng.standard_normal((512, 16)) / 16).astype(ml_dtypes.bfloat16)
    builder = relax.BlockBuilder()
    x, w = relax.Var("x", relax.TensorType(a.shape, "bfloat16")), relax.Var("w", relax.TensorType(b.shape, "bfloat16"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(relax.op.matmul(x, w)))
        builder.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(builder.get(), target="llvm"), tvm.cpu())
    target = vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()
    host = to_numpy(recompute_aten("mm", [to_torch(a), to_torch(b)], {}))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert host.tobytes() == target.tobytes()
    assert np.abs(target - exact).max() > 8 * np.abs(exact.astype(ml_dtypes.bfloat16) - exact).max()  # a real error


@pytest.fixture(scope="module")
def wide_llama(traces):
    """A bf16 Llama whose MLP is 2048 wide (family_lms.py's llama_wide): the down projection sums 2048 bf16
    products. Its replay on llvm and that replay's bisect, shared by the module's tests (what `fix` and
    `report` find reuses the bisect's verdicts, as the REPL's commands do)."""
    trace, _ = traces.record(f"{MODELS}:build_llama_wide_bf16", name="bf16_llama_wide")
    with tapml_dbg.open(trace) as replay:
        yield trace, replay, replay.bisect()


def test_tvm_sums_a_bf16_matmul_in_bf16_on_llvm_and_fix_computes_it_in_float32(wide_llama, tmp_path):
    """TVM 0.27's real bf16 bug: llvm's matmul rounds to bf16 at every step of the sum (torch sums in
    float32 and rounds once). The bisect names the down projection's mm, alone on recorded inputs,
    class precision; `fix` computes it in float32 and the whole model then passes."""
    trace, replay, result = wide_llama
    culprit = result.culprit
    assert result.diverged and culprit.op == "aten.mm.default", culprit
    assert (culprit.layer, culprit.verdict, str(culprit.wrong)) == (
        "model.layers.0.mlp.down_proj", "isolated", "precision")
    assert "accumulating in bfloat16 on the host reproduces it" in culprit.evidence
    assert culprit.metrics.scale_rel_err > 0.04  # 5.3%: the source itself is 21x closer to float64
    out = tmp_path / "fix"
    found = replay.fix(out).to_json()  # what `tapml-dbg fix --json` prints
    assert found["output_passed"] is True and found["unfixed"] == [], found
    assert [(op["index"], op["kind"]) for op in found["fixed"]] == [(culprit.index, "float32")]
    assert "cast back to bfloat16" in found["fixed"][0]["how"]
    run = run_cli("run", str(trace), "--offload", "all", "--transform", f"{out}/fix.py:fix", "--json")
    assert run.returncode == 0 and json.loads(run.stdout)["passed"] is True, run.stdout + run.stderr


def test_a_bf16_dump_holds_raw_bits_and_reproduces_without_the_model(wide_llama, tmp_path):
    _, replay, result = wide_llama
    session = replay.session
    op = next(op for op in session.ops if op.layer == "model.layers.0.mlp.down_proj" and op.op == "aten.mm.default")
    dumped = dump_op(session, op.index, tmp_path / "repro", command="test dump")
    assert (dumped.status, dumped.reproduces) == ("fail", True)
    meta = json.loads((tmp_path / "repro" / "meta.json").read_text())
    with np.load(tmp_path / "repro" / "data.npz", allow_pickle=False) as npz:
        stored = {key: npz[key].dtype for key in npz.files}
    recorded = {key: dtype for key, dtype in stored.items() if key.startswith("op/")}
    assert len(recorded) == 3 and set(recorded.values()) == {np.dtype(np.uint16)}  # bf16: its raw bits
    assert stored[f"reference/{op.name}/0"] == np.float64  # the source's float64 reference, for the noise floor
    assert meta["ops"][0]["outputs"][0]["dtype"] == "bfloat16"
    out = io.StringIO()
    assert lib.repro_main(str(tmp_path / "repro"), [], out=out) == lib.EXIT_REPRODUCED, out.getvalue()
    assert "out 0 bfloat16 (6, 64): FAIL" in out.getvalue()
    written = replay.report(tmp_path / "report", bisect=result)  # what `tapml-dbg report` writes
    culprit = written.report.culprit
    assert (culprit.index, culprit.name, culprit.verdict) == (op.index, op.name, "isolated")
    assert "accumulating in bfloat16" in (tmp_path / "report" / "index.html").read_text()


def test_a_fault_planted_in_a_bf16_lm_is_found_at_its_op(traces, tmp_path):
    """A 25% error at the bf16 `act(gate) * up` of a clean bf16 Qwen2's prefill: above bf16's noise floor,
    found there."""
    trace, _ = _generated(traces, "qwen2")
    with TraceReader(trace) as reader:
        planted = next(op for op in reader.outline.ops if op["layer"] == "model.layers.0.mlp" and op["op"] == "aten.mul.Tensor")
        assert planted["outputs"][0]["dtype"] == "bfloat16" and planted["step"] == 0
    transform = fault_transform(tmp_path, "scale", planted["name"], scale=1.25)
    with Session.open(trace, transform=transform) as session:
        result = session.bisect()
    assert result.diverged
    assert (result.culprit.index, result.culprit.verdict) == (planted["index"], "isolated"), result.culprit
