"""Generation traces: `record --generate N` of an unwrapped causal LM, bisect to a (step, op), the
first bad token with the top-k rule, free running (frontend/generation.py, engine/generation.py).

The model is examples/plain_qwen2.py (a bare Qwen2ForCausalLM: 2 layers, width 32, vocab 64), a
prompt of 8 positions and 3 decode steps. Faults are planted by op name in one decode step, and by
shape (a softmax wrong from some context length on, tests/transforms/long_context.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, ROOT, fault_transform, run_cli
from tapml_dbg.engine.generation import free_running, teacher_forced
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import ModelError, UsageError
from tapml_dbg.frontend.generation import as_generation, parse_steps
from tapml_dbg.judge.tokens import BUG, DRIFT, SAME, compare_step
from tapml_dbg.trace import TraceReader

PROMPT, STEPS = 8, 3
LONG_CONTEXT = ROOT / "tests" / "transforms" / "long_context.py"


@pytest.fixture(scope="module")
def generation(traces):
    return traces.get("plain_qwen2", "--generate", str(STEPS))


@pytest.fixture(scope="module")
def info(generation):
    result = run_cli("info", str(generation), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _ops_of(info, step: int, op: str) -> list[dict]:
    return [o for o in info["ops"] if o["step"] == step and o["op"] == op]


def test_info_steps_match_transformers_generate(info):
    import importlib.util

    spec = importlib.util.spec_from_file_location("plain_qwen2", EXAMPLES / "plain_qwen2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model, (ids,) = module.build()
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=STEPS + 1,
                                  do_sample=False)[0, PROMPT:].tolist()
    assert [s["kind"] for s in info["steps"]] == ["prefill"] + ["decode"] * STEPS
    assert [s["positions"] for s in info["steps"]] == [[0, PROMPT]] + [[PROMPT + k - 1, PROMPT + k]
                                                                       for k in range(1, STEPS + 1)]
    assert [s["token"] for s in info["steps"]] == expected
    steps = [o["step"] for o in info["ops"]]
    assert steps == sorted(steps) and set(steps) == set(range(STEPS + 1))
    for step in range(STEPS + 1):  # each step runs the whole model: one softmax per layer
        assert len(_ops_of(info, step, "aten._softmax.default")) == 2
    assert info["stock_import"] is None  # the static cache's slots need no import fix


def test_clean_generation_finds_nothing(generation):
    with Session.open(generation) as session:
        result = session.bisect()
    assert not result.diverged, result.culprit
    assert result.first_bad_token is None
    assert [s.verdict for s in result.tokens.steps] == [SAME] * (STEPS + 1)
    assert max(s.kl for s in result.tokens.steps) < 1e-6


def test_a_fault_in_one_decode_step_names_that_step_and_op(generation, info, tmp_path):
    softmax = _ops_of(info, 2, "aten._softmax.default")[1]  # layer 1's softmax of decode step 2 only
    result = run_cli("bisect", str(generation), "--json", "--transform",
                     fault_transform(tmp_path, "scale", softmax["name"]))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["op"]["index"], found["op"]["name"], found["op"]["step"]) == (softmax["index"], softmax["name"], 2)
    assert found["op"]["layer"] == "model.layers.1.self_attn"
    assert found["first_bad_token"] is None  # a 1 % error does not change a token here


def test_a_fault_from_a_context_length_on_names_the_first_step_past_it(generation, info, tmp_path):
    """Softmax rows attending to >= PROMPT + 2 positions are wrong: the prefill (row i attends to i + 1)
    and decode step 1 are right; the first wrong op is step 2's first softmax (it attends to the
    prompt and two generated tokens)."""
    transform = tmp_path / "long_context.py"
    transform.write_text(LONG_CONTEXT.read_text() + f"\nSETTINGS = {{'from': {PROMPT + 2}}}\n")
    with Session.open(generation, transform=f"{transform}:softmax_from") as session:
        result = session.bisect()
    first = _ops_of(info, 2, "aten._softmax.default")[0]
    assert result.diverged and (result.culprit.index, result.culprit.step) == (first["index"], 2)


def test_first_bad_token_is_the_step_whose_logits_are_wrong(generation, info, tmp_path):
    """Step 2's logits negated: its top-1 is the source's worst token (a bug, outside the top-k); the
    steps before agree; free running feeds the target its own token from there on."""
    logits = [o for o in info["ops"] if o["step"] == 2 and o["layer"] == "lm_head"][-1]
    transform = fault_transform(tmp_path, "scale", logits["name"], scale=-1)
    with Session.open(generation, transform=transform) as session:
        result = session.bisect(sweep=False)
        assert result.culprit.step == 2
        first = result.first_bad_token
        assert (first.step, first.position, first.in_top_k) == (2, PROMPT + 2, False)
        assert first.source == info["steps"][2]["token"] and first.target != first.source
        assert [s.verdict for s in result.tokens.steps[:2]] == [SAME, SAME]
        assert result.tokens.steps[2].verdict == BUG and result.tokens.steps[2].kl > 1e-3  # random weights: flat logits
        free = free_running(session)
    assert free.runs >= 2  # the target's own token at step 2 fed to step 3
    assert free.steps[2].target == first.target
    assert free.first_bad.step == 2


def test_run_labels_a_generation_s_outputs_logits_then_cache(generation):
    """`run` on a generation trace names each output: the steps' logits, the state, each layer's cache."""
    result = run_cli("run", str(generation), "--offload", "all")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("  output ")]
    assert lines[0].startswith(f"  output output[0] (logits of steps 0..{STEPS}, each step's last position): pass")
    assert "argmax agrees" in lines[0]
    assert "(keys, model.layers.0.self_attn)" in lines[5] and "(values, model.layers.0.self_attn)" in lines[6]
    assert "(cache length, model.layers.1.self_attn)" in lines[-1]
    assert not any("argmax" in line for line in lines[1:])  # a cache's argmax means nothing
    found = json.loads(run_cli("run", str(generation), "--offload", "all", "--json").stdout)
    assert found["outputs"][1]["label"] == "next token index"


def test_json_contract(generation):
    result = run_cli("bisect", str(generation), "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["first_bad_token"] is None and found["op"] is None
    assert [s["step"] for s in found["tokens"]["steps"]] == list(range(STEPS + 1))


def test_token_rule():
    source = np.array([0.0, 5.0, 4.9, 1.0, -2.0])
    assert compare_step(0, 3, source, source).verdict == SAME
    near_tie = compare_step(1, 4, source, np.array([0.0, 4.9, 5.0, 1.0, -2.0]), k=2)
    assert (near_tie.verdict, near_tie.source, near_tie.target) == (DRIFT, 1, 2)
    far = compare_step(2, 5, source, np.array([0.0, 1.0, 1.0, 1.0, 9.0]), k=2)
    assert far.verdict == BUG and far.kl > 1
    assert compare_step(3, 6, source, source * np.nan).kl == float("inf")


def test_bad_generation_requests_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="--generate takes"):
        parse_steps("sixteen")
    with pytest.raises(UsageError, match="1 to"):
        parse_steps(0)
    with pytest.raises(ModelError, match="--generate needs build\\(\\) to return a transformers causal LM"):
        as_generation(torch.nn.Linear(2, 2), (torch.zeros(1, 2),), 2)
    result = run_cli("record", str(EXAMPLES / "mlp.py"), "-o", str(tmp_path / "t.h5"), "--generate", "2")
    assert result.returncode == 1 and "--generate needs" in result.stderr
    with Session.open(_forward_trace(tmp_path)) as session:
        with pytest.raises(UsageError, match="not a generation trace"):
            teacher_forced(session)


def _forward_trace(tmp_path):
    from tapml_dbg.record.recorder import record

    record(str(EXAMPLES / "mlp.py"), tmp_path / "mlp.h5")
    return tmp_path / "mlp.h5"


DYNAMIC_CACHE_MODEL = '''import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM


class FillsACache(torch.nn.Module):
    """A forward that fills a DynamicCache itself: its first update cats a (0,) placeholder."""

    def __init__(self):
        super().__init__()
        config = LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=64, attn_implementation="eager")
        self.lm = LlamaForCausalLM(config).eval()

    def forward(self, ids, mask):
        return self.lm(input_ids=ids, attention_mask=mask, cache=DynamicCache(config=self.lm.config),
                       use_cache=True).logits


def build():
    torch.manual_seed(0)
    return FillsACache().eval(), (torch.randint(0, 64, (1, 6)), torch.ones(1, 6, dtype=torch.long))
'''


def test_a_forward_filling_a_dynamic_cache_imports_with_the_cat_empty_fix(tmp_path):
    """TVM rejects the `cat` of DynamicCache's (0,) placeholder with 4-D keys; the cat-empty fix drops
    the placeholder, the values match eager, and the stock import's failure is the trace's finding."""
    from tapml_dbg.record.recorder import record

    model = tmp_path / "fills_a_cache.py"
    model.write_text(DYNAMIC_CACHE_MODEL)
    record(str(model), tmp_path / "t.h5")
    with TraceReader(tmp_path / "t.h5") as reader:
        stock = reader.meta["stock_import"]
        assert "cat-empty" in stock["fixes"]
        assert "Concat expects all input tensors to have same ndim" in stock["error"]
        assert reader.meta["eager_output_max_abs_diff"] < 1e-5
    with Session.open(tmp_path / "t.h5") as session:
        assert not session.bisect(sweep=False).diverged
