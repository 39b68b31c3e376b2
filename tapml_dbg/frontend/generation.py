"""Greedy generation of a transformers causal LM as one graph: a prefill and N decode steps.

`record MODEL --generate N` drives an unwrapped causal LM (frontend/causal_lm.py says which) the way
`generate()` runs greedy decoding with a KV cache, and records it as ONE call unrolled step by step:

    forward(input_ids, attention_mask, tokens) -> logits (batch, N + 1, vocab)

- step 0, the prefill: the prompt with its attention mask and positions, filling a `DynamicCache`;
- decode step k (1..N): one token, `tokens[:, k - 1]`, with the mask grown by one and the cache of
  the steps before it; the cache is a value of the graph, so it flows between steps as data (the
  trace holds every step's keys and values, as the ops that concatenate them);
- the output is the last position's logits of every step.

`tokens` are the source's greedy tokens (the argmax of each step's logits, computed on the source
before the export), an input of the graph: a replay that propagates the target's own values is
teacher-forced by construction (every step is fed the source's token, so the steps stay aligned
with the recording), while the cache and activations are the target's own.

Why one unrolled graph and not a graph per step or one with a symbolic length: every step's ops are
then ordinary ops of the trace, so isolated/propagated verdicts, bisect, triage, migrate, kept ops,
dump and carve work across steps unchanged, and the compile cache shares the kernels steps have in
common (a decode step's MLP, norms and projections have the same shapes at every step; only the
attention over the growing cache differs). The step of each op is known from the graph: decode step
k starts at the one `select` of `tokens` it reads (`op_steps`).
"""

from __future__ import annotations

import functools
import inspect

from tapml_dbg.errors import ModelError, UsageError
from tapml_dbg.frontend.causal_lm import drive_causal_lm, is_causal_lm
from tapml_dbg.model.generation import DECODE, PREFILL, TOKENS_INPUT, GenerationInfo, StepInfo

MAX_STEPS = 4096  # a bound on --generate that catches a typo (e.g. 16000 for 16), not a limit of the design


def parse_steps(value) -> int:
    """`--generate N`: a whole number of decode steps, 1..MAX_STEPS."""
    try:
        steps = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"--generate takes a number of decode steps (e.g. --generate 16); got {value!r}") from None
    if not 1 <= steps <= MAX_STEPS:
        raise UsageError(f"--generate takes 1 to {MAX_STEPS} decode steps; got {steps}")
    return steps


def as_generation(module, inputs: tuple, steps: int):
    """`(GreedyGeneration, (input_ids, attention_mask, tokens), GenerationInfo)`: what the recorder runs
    for `--generate steps`; a `ModelError` that says what to build for a model that is not a causal LM."""
    import torch

    if not is_causal_lm(module):
        raise ModelError(f"--generate needs build() to return a transformers causal LM (e.g. LlamaForCausalLM) "
                         f"and its input ids, unwrapped; got {type(module).__name__} (record it without "
                         "--generate, or return the bare model)")
    _, (ids, mask), lm = drive_causal_lm(module, inputs)
    if lm.batch != 1:
        raise ModelError(f"--generate records one sequence; build() returned a batch of {lm.batch} "
                         "(return input ids of shape (1, seq))")
    generation = _generation_module()(module)
    with torch.no_grad():
        chosen = generation.greedy(ids, mask, steps)
    tokens = chosen[:, :steps].contiguous()  # step k > 0 is fed the token step k - 1 chose
    prompt = int(ids.shape[1])
    info = GenerationInfo(lm.model_class, prompt, [StepInfo(0, PREFILL, 0, prompt, int(chosen[0, 0]))])
    for k in range(1, steps + 1):
        info.steps.append(StepInfo(k, DECODE, prompt + k - 1, prompt + k, int(chosen[0, k])))
    object.__setattr__(generation, "generation", info)
    return generation, (ids, mask, tokens), info


def generation_of(module) -> GenerationInfo | None:
    """How `as_generation` drove this module; None for a single forward."""
    info = getattr(module, "generation", None)
    return info if isinstance(info, GenerationInfo) else None


def op_steps(program, ops) -> list[int]:
    """The step of each op (`ops`: the imported op table, in order): decode step k starts at the FX
    node that selects `tokens[:, k - 1]`; an op without an FX node of its own is in the step of the
    op before it."""
    step, by_node = 0, {}
    for node in program.graph.nodes:
        if node.op == "call_function" and any(getattr(arg, "name", None) == TOKENS_INPUT and arg.op == "placeholder"
                                              for arg in node.all_input_nodes):
            step += 1
        by_node[node.name] = step
    steps, current = [], 0
    for op in ops:
        current = by_node.get(op.fx_node, current)
        steps.append(current)
    return steps


def _cache_argument(model) -> str:
    """transformers 5 names the cache `cache` (`past_key_values` is deprecated); 4.x only knows the latter."""
    try:
        parameters = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    return "cache" if "cache" in parameters else "past_key_values"


@functools.cache
def _generation_module():
    import torch
    from transformers import DynamicCache

    class GreedyGeneration(torch.nn.Module):
        """Prefill + decode steps with a KV cache, fed `tokens` (teacher forcing); see the module doc."""

        def __init__(self, model):
            super().__init__()
            # share, do not nest: names stay the model's own (`model.layers.0`), as CausalLMLogits does
            self._modules = model._modules
            self._parameters = model._parameters
            self._buffers = model._buffers
            object.__setattr__(self, "lm", model)
            object.__setattr__(self, "cache_argument", _cache_argument(model))
            self.training = model.training

        def _step(self, cache, ids, mask):
            if ids.shape[1] == 1:  # a decode step: the next position after the mask's
                position_ids = mask.long().sum(-1, keepdim=True) - 1
            else:  # the prefill: generate()'s _prepare_position_ids_for_generation
                position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
            kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids, "use_cache": True,
                      self.cache_argument: cache}
            return self.lm(**kwargs).logits[:, -1:]

        def forward(self, input_ids, attention_mask, tokens):
            cache = DynamicCache(config=self.lm.config)
            logits = [self._step(cache, input_ids, attention_mask)]
            mask = attention_mask
            for k in range(tokens.shape[1]):
                token = tokens.select(1, k).unsqueeze(1)  # the one read of `tokens` that starts step k + 1
                mask = torch.cat([mask, torch.ones_like(token, dtype=mask.dtype)], dim=-1)
                logits.append(self._step(cache, token, mask))
            return torch.cat(logits, dim=1)

        def greedy(self, input_ids, attention_mask, steps: int):
            """The source's own greedy tokens: (1, steps + 1), the argmax of every step's logits."""
            cache = DynamicCache(config=self.lm.config)
            chosen = [self._step(cache, input_ids, attention_mask).argmax(-1)]
            mask = attention_mask
            for _ in range(steps):
                token = chosen[-1]
                mask = torch.cat([mask, torch.ones_like(token, dtype=mask.dtype)], dim=-1)
                chosen.append(self._step(cache, token, mask).argmax(-1))
            return torch.cat(chosen, dim=1)

    return GreedyGeneration
