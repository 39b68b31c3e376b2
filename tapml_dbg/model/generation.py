"""A generation's steps as data (trace meta `generation`, schema.META_GENERATION): what the recorder
wrote (frontend/generation.py), what the engine and the renderers read. No torch here."""

from __future__ import annotations

from dataclasses import dataclass, field

TOKENS_INPUT = "tokens"  # the graph input holding the source's greedy tokens (teacher forcing)
PREFILL, DECODE = "prefill", "decode"
PREFILL_STEP = 0  # the step that reads the prompt; decode steps 1..N follow it


def step_kind(step: int) -> str:
    """What a step of a generation is, by its number."""
    return PREFILL if step == PREFILL_STEP else DECODE


@dataclass
class StepInfo:
    """One call of a generation: `positions` [start, end) it adds to the cache, the token it chose."""

    step: int
    kind: str  # PREFILL or DECODE
    start: int
    end: int
    token: int  # the source's greedy choice at this step (the argmax of its last position's logits)

    def to_json(self) -> dict:
        return {"step": self.step, "kind": self.kind, "positions": [self.start, self.end], "token": self.token}

    @staticmethod
    def from_json(data: dict) -> "StepInfo":
        start, end = data["positions"]
        return StepInfo(int(data["step"]), str(data["kind"]), int(start), int(end), int(data["token"]))


@dataclass
class GenerationInfo:
    """How the recorder generated (trace meta `generation`)."""

    model_class: str
    prompt: int  # prompt positions
    steps: list[StepInfo] = field(default_factory=list)

    @property
    def decode_steps(self) -> int:
        return len(self.steps) - 1

    def to_meta(self) -> dict:
        return {"class": self.model_class, "prompt": self.prompt, "input": TOKENS_INPUT,
                "steps": [step.to_json() for step in self.steps]}

    @staticmethod
    def from_meta(meta: dict | None) -> "GenerationInfo | None":
        if not meta:
            return None
        return GenerationInfo(str(meta.get("class", "")), int(meta.get("prompt", 0)),
                              [StepInfo.from_json(step) for step in meta.get("steps", [])])

    @property
    def text(self) -> str:
        """`generation: Qwen2ForCausalLM, a prefill of 8 positions + 16 decode steps (greedy, KV cache)`."""
        return (f"generation: {self.model_class}, a prefill of {self.prompt} positions + {self.decode_steps} "
                "decode steps (greedy, KV cache)")


# a generation trace's output, in order (frontend/generation.py builds it so): every step's logits, then
# the state a next step reads, then each layer's cache
LOGITS_FIELD = "logits"
STATE_FIELDS = ("next token index", "attention mask", "position", "cache slot")
LAYER_FIELDS = ("keys", "values", "cache length")


def output_labels(info: GenerationInfo, layers: list[str]) -> list[str]:
    """What each field of a generation trace's output is, given the layer of the op producing each
    (`logits of steps 0..3, ...`, `keys, model.layers.0.self_attn`); [] when the fields are not that layout."""
    caches, extra = divmod(len(layers) - 1 - len(STATE_FIELDS), len(LAYER_FIELDS))
    if caches < 0 or extra:
        return []
    labels = [f"{LOGITS_FIELD} of steps 0..{len(info.steps) - 1}, each step's last position", *STATE_FIELDS]
    for cache in range(caches):
        first = 1 + len(STATE_FIELDS) + cache * len(LAYER_FIELDS)
        layer = next((layers[first + k] for k in range(len(LAYER_FIELDS)) if layers[first + k]), f"layer {cache}")
        labels += [f"{what}, {layer}" for what in LAYER_FIELDS]
    return labels


def step_ranges(ops: list) -> list[range]:
    """The ops of each generation step, in order (consecutive: a step's ops are one range); one range
    of every op outside a generation trace."""
    ranges, start = [], 0
    for index in range(1, len(ops) + 1):
        if index == len(ops) or ops[index].step != ops[start].step:
            ranges.append(range(start, index))
            start = index
    return ranges or [range(0)]


def fused_spans(ops: list) -> list[range]:
    """The generation steps as the fused search probes them: `step_ranges`, with the last step's ops past
    those that repeat the step before it (the graph's epilogue: the concatenation of every step's logits
    and the returned state) a span of their own, so that the last decode step is the structure of every
    other and shares its compiled unit."""
    spans = step_ranges(ops)
    if len(spans) < 3:  # no two decode steps to compare
        return spans
    before, last = spans[-2], spans[-1]
    body = range(last.start, last.start + len(before))
    if len(last) > len(before) and all(ops[i].op == ops[j].op for i, j in zip(before, body)):
        return spans[:-1] + [body, range(body.stop, last.stop)]
    return spans
