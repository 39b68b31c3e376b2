"""Unwrapped transformers causal LMs: driven as `generate()` drives a prefill, recording the logits.

`build()` may return a bare `LlamaForCausalLM` / `Qwen2ForCausalLM` / `GPT2LMHeadModel` (any
`transformers.PreTrainedModel` that can generate and is not an encoder-decoder) with its input ids.
Called as it is, its forward returns a `CausalLMOutputWithPast` holding a `DynamicCache`, which
torch.export and the TVM import cannot carry. The recorder then runs `CausalLMLogits` instead:

- `forward(input_ids, attention_mask)`, the names the trace's inputs get;
- an explicit attention mask (all ones unless the build gives one, as `generate()` builds it:
  int64 of the ids' shape), so that transformers' mask code takes its mask path, not the
  no-mask one that imports bool `cumsum`/`index`/`eq` TVM 0.27 cannot compile;
- positions as `generate()` computes them from the mask (`cumsum(mask) - 1`, 0 at padding), when
  the model's forward takes `position_ids`;
- `use_cache=False` (no cache object in the export), returning `.logits` alone.

The wrapper shares the model's submodules, parameters and buffers (it does not nest the model
under a name of its own), so layers and parameters keep the model's own names (`model.layers.0.mlp`).
A model whose class overrides `forward` with a signature of its own (a user's wrapper such as
examples/tiny_llama.py's `LlamaLogits`) is left alone: the `(module, inputs)` contract holds for it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass

from tapml_dbg.errors import ModelError

INPUT_NAMES = ("input_ids", "attention_mask")  # the recorded inputs of a causal LM, in this order
MASK_ALL_ONES = "attention mask all ones"


@dataclass
class CausalLMInfo:
    """How the recorder drove the model (trace meta `causal_lm`)."""

    model_class: str
    batch: int
    positions: int
    mask: str  # MASK_ALL_ONES, or "attention mask as given (N padded positions)"
    position_ids: bool  # the model was given positions computed from the mask

    def to_meta(self) -> dict:
        return {"class": self.model_class, "batch": self.batch, "positions": self.positions, "mask": self.mask,
                "position_ids": self.position_ids}

    @staticmethod
    def text_of(meta: dict) -> str:
        """`causal LM: Qwen2ForCausalLM, logits of 8 positions, attention mask all ones`."""
        batch = f" (batch {meta['batch']})" if meta.get("batch", 1) != 1 else ""
        return f"causal LM: {meta.get('class')}, logits of {meta.get('positions')} positions{batch}, {meta.get('mask')}"

    @property
    def text(self) -> str:
        return self.text_of(self.to_meta())


def is_causal_lm(module) -> bool:
    """A transformers decoder-only model that generates, with the library's own forward signature."""
    transformers = sys.modules.get("transformers")  # a model of transformers' was built with it imported
    if transformers is None:
        return False
    try:
        pretrained = transformers.PreTrainedModel
    except Exception:  # a broken or partial install: not ours to drive
        return False
    if not isinstance(module, pretrained):
        return False
    config = getattr(module, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        can_generate = bool(module.can_generate())
    except Exception:
        can_generate = False
    if not can_generate:
        return False
    parameters = _forward_parameters(module)
    # the library's forward: keyword `attention_mask` and `use_cache` (or **kwargs); a class that
    # overrides forward with positional (ids, mask) -> logits is a wrapper already
    return "attention_mask" in parameters and ("use_cache" in parameters or _takes_kwargs(module))


def drive_causal_lm(module, inputs: tuple):
    """`(CausalLMLogits(module), (input_ids, attention_mask), CausalLMInfo)` for a causal LM built
    with `(ids,)` or `(ids, attention_mask)`; a `ModelError` saying what to return for other inputs."""
    import torch

    name = type(module).__name__
    if not 1 <= len(inputs) <= 2:
        raise ModelError(f"build() returned the transformers causal LM {name}: return its input ids, "
                         f"(model, (input_ids,)) or (model, (input_ids, attention_mask)); got {len(inputs)} "
                         "inputs (for other inputs, wrap the model in a module whose forward returns tensors)")
    ids = inputs[0]
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ModelError(f"build() returned the transformers causal LM {name}: its first input must be token "
                         f"ids, an integer tensor (batch, seq); got {ids.dtype} {tuple(ids.shape)}")
    if len(inputs) == 2:
        mask = inputs[1]
        if tuple(mask.shape) != tuple(ids.shape):
            raise ModelError(f"build() returned the transformers causal LM {name}: the attention mask must have "
                             f"the ids' shape {tuple(ids.shape)}; got {tuple(mask.shape)}")
    else:
        mask = torch.ones(ids.shape, dtype=torch.long)  # as generate() builds it
    ids = ids.to(torch.long)
    padded = int((mask == 0).sum())
    positions = "position_ids" in _forward_parameters(module)
    info = CausalLMInfo(model_class=name, batch=int(ids.shape[0]), positions=int(ids.shape[1]),
                        mask=MASK_ALL_ONES if not padded else f"attention mask as given ({padded} padded positions)",
                        position_ids=positions)
    return CausalLMLogits(module, positions), (ids, mask), info


def as_recorded(module, inputs: tuple):
    """What the recorder runs: `(CausalLMLogits, (input_ids, attention_mask))` for an unwrapped causal
    LM (its `causal_lm` attribute says how it was driven), else `(module, inputs)` unchanged."""
    if not is_causal_lm(module):
        return module, inputs
    wrapper, driven_inputs, info = drive_causal_lm(module, inputs)
    object.__setattr__(wrapper, "causal_lm", info)
    return wrapper, driven_inputs


def causal_lm_of(module) -> CausalLMInfo | None:
    """How `as_recorded` drove this module; None for a model run as it is."""
    info = getattr(module, "causal_lm", None)
    return info if isinstance(info, CausalLMInfo) else None


def _forward_parameters(module) -> dict:
    try:
        return dict(inspect.signature(type(module).forward).parameters)
    except (TypeError, ValueError):
        return {}


def _takes_kwargs(module) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _forward_parameters(module).values())


@functools.cache
def _logits_module():
    import torch

    class CausalLMLogits(torch.nn.Module):
        """`forward(input_ids, attention_mask) -> logits` of a causal LM, as `generate()` runs its prefill."""

        def __init__(self, model, position_ids: bool):
            super().__init__()
            # share, do not nest: names stay the model's own (`model.layers.0`, not `lm.model.layers.0`)
            self._modules = model._modules
            self._parameters = model._parameters
            self._buffers = model._buffers
            object.__setattr__(self, "lm", model)  # not a registered submodule
            object.__setattr__(self, "pass_positions", position_ids)
            self.training = model.training

        def forward(self, input_ids, attention_mask):
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
            if self.pass_positions:  # generate()'s _prepare_position_ids_for_generation
                position_ids = attention_mask.long().cumsum(-1) - 1
                kwargs["position_ids"] = position_ids.masked_fill(attention_mask == 0, 0)
            return self.lm(**kwargs).logits

    return CausalLMLogits


def CausalLMLogits(model, position_ids: bool = True):  # noqa: N802 (a class made on first use: torch is heavy)
    return _logits_module()(model, position_ids)
