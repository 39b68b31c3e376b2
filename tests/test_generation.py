"""Generation traces: `record --generate N` of an unwrapped causal LM, bisect to a (step, op), the
first bad token with the top-k rule, free running (frontend/generation.py, engine/generation.py).

The model is examples/plain_qwen2.py (a bare Qwen2ForCausalLM: 2 layers, width 32, vocab 64), a
prompt of 8 positions and 3 decode steps. Faults are planted by shape here (a softmax wrong from some
context length on, tests/transforms/long_context.py); a fault planted by op name in one decode step
is docs/generation.md's transcript (`_softmax_5`, step 2: named with its step and layer, every token
the source's). tests/test_generation_report.py runs the generation end to end, one session for the
clean generation (bisect, `run`'s outputs, the report) and one for step 2's logits negated (the first
bad token in bisect, free running, the report, a search again from the memo).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, ROOT, run_cli
from tapml_dbg.engine.generation import teacher_forced
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


def test_token_rule():
    source = np.array([0.0, 5.0, 4.9, 1.0, -2.0])
    assert compare_step(0, 3, source, source).verdict == SAME
    near_tie = compare_step(1, 4, source, np.array([0.0, 4.9, 5.0, 1.0, -2.0]), k=2)
    assert (near_tie.verdict, near_tie.source, near_tie.target) == (DRIFT, 1, 2)
    far = compare_step(2, 5, source, np.array([0.0, 1.0, 1.0, 1.0, 9.0]), k=2)
    assert far.verdict == BUG and far.kl > 1
    assert compare_step(3, 6, source, source * np.nan).kl == float("inf")


def test_bad_generation_requests_are_one_line_errors(traces, tmp_path):
    with pytest.raises(UsageError, match="--generate takes"):
        parse_steps("sixteen")
    with pytest.raises(UsageError, match="1 to"):
        parse_steps(0)
    with pytest.raises(ModelError, match="--generate needs build\\(\\) to return a transformers causal LM"):
        as_generation(torch.nn.Linear(2, 2), (torch.zeros(1, 2),), 2)
    result = run_cli("record", str(EXAMPLES / "mlp.py"), "-o", str(tmp_path / "t.h5"), "--generate", "2")
    assert result.returncode == 1 and "--generate needs" in result.stderr
    with Session.open(traces.get("mlp")) as session:  # one forward: the suite's shared trace
        with pytest.raises(UsageError, match="not a generation trace"):
            teacher_forced(session)


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
