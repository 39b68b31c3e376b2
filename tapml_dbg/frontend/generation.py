"""Greedy generation of a transformers causal LM as one graph: a prefill and N decode steps.

`record MODEL --generate N` drives an unwrapped causal LM (frontend/causal_lm.py says which) the way
`generate()` runs greedy decoding with a KV cache, and records it as ONE call unrolled step by step:

    forward(input_ids, attention_mask, tokens) -> (logits (batch, N + 1, vocab), *state)

- the KV cache is transformers' `StaticCache` of prompt + N slots (what `generate()` uses with
  `cache_implementation="static"`), its layers' update written functionally (`SlotLayer`); the
  attention mask covers every slot, 0 where nothing is written yet;
- step 0, the prefill: the prompt with its attention mask and positions, filling slots [0, prompt);
- decode step k (1..N): one token, `tokens[:, k - 1]`, written to slot prompt + k - 1 with the mask
  opened there and the cache of the steps before it; the cache is a value of the graph, so it flows
  between steps as data (the trace holds every step's keys and values);
- the output is the last position's logits of every step, then the state a next step would read (the
  token index, mask, position, slot and every layer's keys, values and length), as a deployment's
  decode call returns its cache: so the last step computes and hands on what every step does.

`tokens` are the source's greedy tokens (the argmax of each step's logits, computed on the source
before the export), an input of the graph: a replay that propagates the target's own values is
teacher-forced by construction (every step is fed the source's token, so the steps stay aligned
with the recording), while the cache and activations are the target's own.

Why one unrolled graph and not a graph per step or one with a symbolic length: every step's ops are
then ordinary ops of the trace, so isolated/propagated verdicts, bisect, triage, migrate, kept ops,
dump and carve work across steps unchanged, and the compile cache shares the kernels steps have in
common. The step of each op is known from the graph: decode step
k starts at the one `index_select` of `tokens` it reads (`op_steps`). Nothing in a decode step is
a constant of that step (the token it reads, its cache slot and its position are values), so every
decode step is the same ops on the same shapes: a decode step compiles once, per op and fused.
"""

from __future__ import annotations

import functools
import inspect

from tapml_dbg.errors import ModelError, UsageError
from tapml_dbg.frontend.causal_lm import drive_causal_lm, is_causal_lm
from tapml_dbg.model.generation import PREFILL_STEP, TOKENS_INPUT, GenerationInfo, StepInfo, step_kind

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
    try:
        generation = _generation_module()(module)
    except ImportError as exc:  # transformers before its StaticCache layers (4.56)
        raise ModelError(f"--generate needs a transformers with StaticCache layers (5.x; {exc}): "
                         "pip install -U transformers") from None
    with torch.no_grad():
        chosen = generation.greedy(ids, mask, steps)
    tokens = chosen[:, :steps].contiguous()  # step k > 0 is fed the token step k - 1 chose
    prompt = int(ids.shape[1])
    info = GenerationInfo(lm.model_class, prompt, [  # step k adds positions [start, prompt + k) to the cache
        StepInfo(k, step_kind(k), 0 if k == PREFILL_STEP else prompt + k - 1, prompt + k, int(chosen[0, k]))
        for k in range(steps + 1)])
    object.__setattr__(generation, "generation", info)
    return generation, (ids, mask, tokens), info


def generation_of(module) -> GenerationInfo | None:
    """How `as_generation` drove this module; None for a single forward."""
    info = getattr(module, "generation", None)
    return info if isinstance(info, GenerationInfo) else None


def op_steps(program, ops) -> list[int]:
    """The step of each op (`ops`: the imported op table, in order): decode step k starts at the FX
    node that reads `tokens[:, k - 1]`; an op without an FX node of its own is in the step of the
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
def _slot_layer():
    import torch
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """transformers' static cache layer, written functionally: the new keys and values are placed in
        their slots with a `where` over the slot index (StaticLayer's in-place `index_copy_` decomposes
        to an `index_put` with None indices, which TVM 0.27's import refuses). Every write is one shape
        whatever the step, so every decode step's ops are the same ops."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            length = key_states.shape[-2]
            slots = torch.arange(self.max_cache_len, device=key_states.device)
            start = self.cumulative_length
            index = (slots - start).clamp(0, length - 1)
            written = ((slots >= start) & (slots < start + length)).view(1, 1, -1, 1)
            self.keys = torch.where(written, key_states.index_select(2, index), self.keys)
            self.values = torch.where(written, value_states.index_select(2, index), self.values)
            self.cumulative_length = self.cumulative_length + length
            return self.keys, self.values

    return SlotLayer


@functools.cache
def _generation_module():
    import torch
    from transformers import StaticCache

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

        def _cache(self, slots: int):
            """transformers' StaticCache of `slots` positions, its layers written functionally."""
            cache = StaticCache(config=self.lm.config, max_cache_len=slots)
            cache.layers = [_slot_layer()(max_cache_len=slots) for _ in cache.layers]
            return cache

        def _step(self, cache, ids, mask, position_ids, cache_position):
            kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids, "use_cache": True,
                      "cache_position": cache_position, self.cache_argument: cache}
            return self.lm(**kwargs).logits[:, -1:]

        def _prefill(self, input_ids, attention_mask, steps: int):
            """The cache, the mask over every slot (the decode steps' slots 0) and the prefill's logits."""
            prompt = input_ids.shape[1]
            cache = self._cache(prompt + steps)
            mask = torch.cat([attention_mask, attention_mask.new_zeros(attention_mask.shape[0], steps)], dim=-1)
            positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)  # generate()'s
            logits = self._step(cache, input_ids, mask, positions, torch.arange(prompt))
            return cache, mask, positions[:, -1:], logits

        def _decode(self, cache, token, mask, position, slot):
            """One decode step: `token` at cache slot `slot` (a tensor: no step's ops differ by a constant)."""
            slots = torch.arange(mask.shape[-1])
            mask = torch.where(slots == slot, torch.ones_like(mask), mask)
            return mask, self._step(cache, token, mask, position.view(1, 1), slot.view(1))

        def _generate(self, input_ids, attention_mask, steps: int, feed) -> tuple[list, list]:
            """The prefill and `steps` decode steps, each fed `feed(last logits)`: every step's logits, and
            the state a next step would read (the mask, position, slot and every layer's cache)."""
            cache, mask, position, first = self._prefill(input_ids, attention_mask, steps)
            logits, slot = [first], cache.layers[0].cumulative_length
            for _ in range(steps):
                token = feed(logits[-1])
                position = position + 1
                mask, step_logits = self._decode(cache, token, mask, position, slot)
                logits.append(step_logits)
                slot = slot + 1
            state = [mask, position, slot] + [value for layer in cache.layers
                                              for value in (layer.keys, layer.values, layer.cumulative_length)]
            return logits, state

        def forward(self, input_ids, attention_mask, tokens):
            read = [None]  # which token the next step reads: a value, not a constant (made after the prefill)

            def recorded(_logits):  # the one read of `tokens` that starts a decode step
                if read[0] is None:
                    read[0] = torch.zeros(1, dtype=torch.long)
                token = tokens.index_select(1, read[0])
                read[0] = read[0] + 1
                return token

            logits, state = self._generate(input_ids, attention_mask, tokens.shape[1], recorded)
            # the state is returned as a deployment's decode call returns its cache: so the last step hands on
            # what every other step does, and is their structure (one compiled unit for every decode step)
            return (torch.cat(logits, dim=1), read[0], *state)

        def greedy(self, input_ids, attention_mask, steps: int):
            """The source's own greedy tokens: (1, steps + 1), the argmax of every step's logits."""
            logits, _state = self._generate(input_ids, attention_mask, steps, lambda last: last.argmax(-1))
            return torch.cat([step.argmax(-1) for step in logits], dim=1)

    return GreedyGeneration
