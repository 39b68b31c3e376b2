"""Unwrapped transformers causal LMs: recorded as generate() runs a prefill, logits out, clean on llvm.

`build()` returns the bare model and its ids (`return Qwen2ForCausalLM(cfg).eval(), (ids,)`); the
recorder drives it with an all-ones attention mask, positions from the mask and use_cache=False
(frontend/causal_lm.py, docs/causal-lm.md). Tiny configs (1 layer, width 32, vocab 64, 6 positions).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, fault_transform
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import ModelError
from tapml_dbg.frontend.causal_lm import INPUT_NAMES, drive_causal_lm, is_causal_lm
from tapml_dbg.record.recorder import record
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.inspect import trace_info

SEQ, VOCAB = 6, 64
EXACT = 1e-6  # the Llama family's decomposed graph differs from eager in the last bits (as examples/tiny_llama.py)
_ATTENTION = "num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4"
FAMILIES = {  # name: (config class, model class, config arguments)
    "llama": ("LlamaConfig", "LlamaForCausalLM", f"{_ATTENTION}, num_key_value_heads=2"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", f"{_ATTENTION}, num_key_value_heads=2"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "n_layer=1, n_embd=32, n_head=4, n_positions=64, bos_token_id=0, "
             "eos_token_id=0"),
    "mistral": ("MistralConfig", "MistralForCausalLM", f"{_ATTENTION}, num_key_value_heads=2"),
    "phi": ("PhiConfig", "PhiForCausalLM", _ATTENTION),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", f"{_ATTENTION}, num_key_value_heads=2, head_dim=8"),
}


def _model_file(folder, family: str, extra: str = "") -> str:
    """A model file whose build() returns the bare model and `(ids,)`."""
    config, model, arguments = FAMILIES[family]
    path = folder / f"plain_{family}.py"
    text = f"""import torch
from transformers import {config}, {model}


def build():
    torch.manual_seed(0)
    config = {config}({arguments}, vocab_size={VOCAB}, attn_implementation="eager")
    model = {model}(config).eval()
    return model, (torch.randint(0, {VOCAB}, (1, {SEQ})),{extra})
"""
    if not path.exists() or path.read_text() != text:  # the run's shared folder: another worker may read it
        partial = path.with_suffix(f".part{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)
    return str(path)


def recorded(traces, family: str) -> tuple[Path, str, str]:
    """The bare `family` model recorded through the CLI once per run (tests/test_source_location.py plants
    a fault in the llama): (trace, model file, what `record` printed)."""
    spec = _model_file(traces.folder, family)
    trace, stdout = traces.record(spec, name=f"plain_{family}")
    return trace, spec, stdout


def _build(spec: str):
    loaded = importlib.util.spec_from_file_location("plain_model", spec)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module.build()


def _check_logits(trace, spec: str) -> None:
    """The trace's inputs are (input_ids, attention_mask of ones) and its output the model's own logits."""
    model, (ids,) = _build(spec)
    with torch.no_grad():
        expected = model(ids).logits.numpy()  # the model called plainly, as a user would
    with TraceReader(trace) as reader:
        assert reader.complete
        assert tuple(reader.outline.input_names) == INPUT_NAMES
        assert np.array_equal(reader.tensors.input("input_ids"), ids.numpy())
        mask = reader.tensors.input("attention_mask")
        assert mask.dtype == np.int64 and mask.shape == (1, SEQ) and (mask == 1).all()
        last = reader.outline.ops[-1]
        (logits,) = reader.tensors.op_outputs(last["index"])
        assert reader.meta["causal_lm"]["positions"] == SEQ
    assert logits.shape == (1, SEQ, VOCAB) == expected.shape
    np.testing.assert_allclose(logits, expected, rtol=0, atol=EXACT)


@pytest.fixture(scope="module")
def plain_qwen2(traces):
    """A bare Qwen2ForCausalLM recorded through the CLI: (trace, model file, the record command's stdout)."""
    return recorded(traces, "qwen2")


def test_cli_records_a_bare_qwen2_and_says_how(plain_qwen2, capsys):
    trace, spec, stdout = plain_qwen2
    assert f"causal LM: Qwen2ForCausalLM, logits of {SEQ} positions, attention mask all ones" in stdout
    _check_logits(trace, spec)
    info = trace_info(str(trace))
    assert info["causal_lm"] == {"class": "Qwen2ForCausalLM", "batch": 1, "positions": SEQ,
                                 "mask": "attention mask all ones", "position_ids": True}
    assert info["ops"][-1]["outputs"][0]["shape"] == [1, SEQ, VOCAB]
    assert any(op["layer"] == "model.layers.0.self_attn" for op in info["ops"])  # the model's own names
    from tapml_dbg.ui import cli

    assert cli.main(["info", str(trace)]) == 0
    assert "driven as" in capsys.readouterr().out


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "phi", "gemma"])
def test_plain_causal_lm_records_its_logits(traces, family):
    trace, spec, stdout = recorded(traces, family)
    assert f"causal LM: {FAMILIES[family][1]}, logits of {SEQ} positions" in stdout
    _check_logits(trace, spec)


def test_clean_plain_model_bisects_clean(plain_qwen2):
    with Session.open(plain_qwen2[0]) as session:
        result = session.bisect()
    assert not result.diverged, result.culprit


def test_planted_fault_in_a_plain_model_is_found(plain_qwen2, tmp_path):
    with TraceReader(plain_qwen2[0]) as reader:
        softmax = next(op for op in reader.outline.ops if op["op"] == "aten._softmax.default")
    with Session.open(plain_qwen2[0], transform=fault_transform(tmp_path, "scale", softmax["name"])) as session:
        result = session.bisect(sweep=False)
    assert result.diverged
    assert (result.culprit.index, result.culprit.name) == (softmax["index"], softmax["name"])
    assert result.culprit.verdict == "isolated"
    assert result.culprit.layer == "model.layers.0.self_attn"


def test_a_given_mask_is_kept_and_wrappers_keep_the_contract(tmp_path):
    """(ids, mask) is taken as given; a class overriding forward (examples/tiny_llama.py) is not driven."""
    model, (ids, mask) = _build(_model_file(tmp_path, "llama", extra=" torch.ones(1, 6, dtype=torch.long)"))
    mask[0, 0] = 0
    wrapper, inputs, info = drive_causal_lm(model, (ids, mask))
    assert inputs[1] is mask and info.mask == "attention mask as given (1 padded positions)"
    positions = torch.tensor([[0, 0, 1, 2, 3, 4]])  # generate()'s: cumsum(mask) - 1, 0 at padding
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        assert torch.equal(wrapper(*inputs), expected)
    wrapped, _ = _build(str(EXAMPLES / "tiny_llama.py"))
    assert is_causal_lm(model) and not is_causal_lm(wrapped) and not is_causal_lm(torch.nn.Linear(2, 2))
    with pytest.raises(ModelError, match="token ids, an integer tensor"):
        drive_causal_lm(model, (torch.randn(1, 6),))
    with pytest.raises(ModelError, match="return its input ids"):
        drive_causal_lm(model, (ids, mask, ids))


def test_a_cache_in_the_output_says_to_return_logits(tmp_path):
    """A wrapper that returns the model's whole output (a DynamicCache in it) fails with the fix, not
    with a hint about data-dependent control flow."""
    path = tmp_path / "cached.py"
    path.write_text(open(_model_file(tmp_path, "qwen2")).read() + """

class Whole(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids)


def cached():
    model, inputs = build()
    return Whole(model), inputs
""")
    with pytest.raises(ModelError) as caught:
        record(f"{path}:cached", tmp_path / "t.h5")
    message = str(caught.value)
    assert "DynamicCache" in message and "use_cache=False" in message and ".logits" in message
    assert "data-dependent" not in message

