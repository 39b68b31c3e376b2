"""Capture budgets: which ops of a recording keep their tensors; the rest keep stats only.

A big model's full trace is large (GPT-2 124M: ~1 GiB). `tapml-dbg record --window OPS|LAYER`
and/or `--max-bytes N` store every op's stats but full tensors only for a *window* of ops,
plus the values the window reads from outside it (its *boundary inputs*), so every op in the
window has an isolated verdict. The plan is made from the op table before anything runs
(shapes are static), and stored in the trace's meta under `capture`.

Pure functions over op-table dicts (`index`, `name`, `layer`, `inputs`, `outputs`): the
recorder plans with them, the reader and the replay engine explain missing values with them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from tapml_dbg.errors import UsageError
from tapml_dbg.trace.schema import spec_nbytes
from tapml_dbg.model.select import LAYER, OpTable

SUGGEST_MARGIN = 10  # ops on each side of an op when suggesting a window to record
WINDOW_LISTING = "`tapml-dbg info TRACE --json` lists ops and layers"  # for a --window typo
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30}


@dataclass
class CapturePlan:
    """Which ops keep tensors. `first:end` (end exclusive) is the window after the byte budget."""

    window: str | None  # the --window text as given (None: only --max-bytes)
    max_bytes: int | None  # the --max-bytes budget for op tensors (None: no budget)
    first: int
    end: int
    layer: str | None = None  # the layer the window was given as
    stored: list[int] = field(default_factory=list)  # ops with tensors: the window + its boundary inputs
    stored_bytes: int = 0  # raw bytes of the stored ops' tensors
    truncated: bool = False  # the byte budget ended the window early

    def to_meta(self) -> dict:
        data = asdict(self)
        data["stored"] = _ranges(self.stored)
        return data

    @staticmethod
    def from_meta(data: dict | None) -> "CapturePlan | None":
        if not isinstance(data, dict):
            return None
        stored = []
        for first, last in data.get("stored", []):
            stored.extend(range(int(first), int(last) + 1))
        return CapturePlan(window=data.get("window"), max_bytes=data.get("max_bytes"),
                           first=int(data.get("first", 0)), end=int(data.get("end", 0)),
                           layer=data.get("layer"), stored=stored,
                           stored_bytes=int(data.get("stored_bytes", 0)),
                           truncated=bool(data.get("truncated", False)))

    @property
    def how(self) -> str:
        """How the trace was recorded, as the options that gave it (for messages)."""
        parts = []
        if self.window is not None:
            parts.append(f"--window {self.window}")
        if self.max_bytes is not None:
            parts.append(f"--max-bytes {self.max_bytes}")
        return " ".join(parts)

    @property
    def describe(self) -> str:
        cut = f", cut short by --max-bytes {self.max_bytes}" if self.truncated else ""
        layer = f" (layer {self.layer})" if self.layer else ""
        return f"ops {self.first}..{self.end - 1}{layer}{cut}"


def parse_size(text: str | int | None) -> int | None:
    """`--max-bytes` value: 200000000, 200M, 1.5G, 512MiB (decimal K/M/G, binary Ki/Mi/Gi)."""
    if text is None or isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise UsageError(f"bad size {text!r}: give bytes, e.g. 200000000, 200M, 1.5G or 512MiB")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def op_bytes(op: dict) -> int:
    """Bytes of an op's outputs, from its op-table entry."""
    return sum(spec_nbytes(spec) for spec in op.get("outputs", []))


def resolve_window(ops: list[dict], text: str) -> tuple[int, int, str | None]:
    """`--window` → (first, end, layer or None): any op selector, by the one set of rules.

    A window is contiguous, so a layer spans its first to last op (layers are contiguous in
    practice). See `tapml_dbg.model.select` for the selector rules.
    """
    try:
        selection = OpTable.of(ops, listing=WINDOW_LISTING).select(text)
    except UsageError as exc:
        raise UsageError(f"--window {text.strip()} holds no op: {exc}") from None
    layer = selection.label if selection.kind == LAYER else None
    return selection.first, selection.end, layer


def plan_capture(ops: list[dict], window: str | None = None, max_bytes: int | None = None) -> CapturePlan | None:
    """The ops whose tensors a recording with this budget stores; None when there is no budget."""
    if window is None and max_bytes is None:
        return None
    first, end, layer = resolve_window(ops, window) if window is not None else (0, len(ops), None)
    if max_bytes is not None and max_bytes < 0:
        raise UsageError("--max-bytes must be positive")
    by_name = {op["name"]: op for op in ops}
    stored: set[int] = set()
    used = 0
    cut = end
    for op in ops[first:end]:
        new = [op["index"]] + [by_name[name]["index"] for name in op.get("inputs", [])
                               if name in by_name and by_name[name]["index"] < first]
        new = [i for i in dict.fromkeys(new) if i not in stored]
        cost = sum(op_bytes(ops[i]) for i in new)
        if max_bytes is not None and used + cost > max_bytes:
            cut = op["index"]
            break
        stored.update(new)
        used += cost
    if cut == first:
        raise UsageError(f"--max-bytes {max_bytes} is too small for even op {first} ({ops[first]['name']}), "
                         f"whose tensors and inputs take {cost} bytes")
    return CapturePlan(window=window, max_bytes=max_bytes, first=first, end=cut, layer=layer,
                       stored=sorted(stored), stored_bytes=used, truncated=cut < end)


def suggest_window(ops: list[dict], plan: CapturePlan | None, indices: list[int]) -> str:
    """A --window that would store values for `indices`: their layer when the trace used a layer."""
    if plan is not None and plan.layer:
        depth = len(plan.layer.split("."))
        layers = {".".join(ops[i].get("layer", "").split(".")[:depth]) for i in indices}
        layers.discard("")
        if len(layers) == 1:
            (layer,) = layers
            if len(layer.split(".")) == depth:
                return layer
    first = max(0, min(indices) - SUGGEST_MARGIN)
    end = min(len(ops), max(indices) + SUGGEST_MARGIN + 1)
    return f"{first}:{end}"


def missing_values_message(ops: list[dict], meta: dict, index: int, needed_by: int | None = None) -> str:
    """Why op `index` has no values in a capture-budget trace, and the command that records them."""
    plan = CapturePlan.from_meta(meta.get("capture"))
    op = ops[index]
    model = meta.get("model") or "MODEL"
    how = f"recorded with {plan.how}: tensors for {plan.describe}" if plan else "recorded with a capture budget"
    targets = [index] if needed_by is None else [needed_by, index]
    suggestion = f"tapml-dbg record {model} --window {suggest_window(ops, plan, targets)}"
    subject = f"op {index} ({op['name']})"
    if needed_by is not None:
        user = ops[needed_by]
        subject = f"op {needed_by} ({user['name']}) reads op {index} ({op['name']}), which"
    return f"{subject} has only stats in this trace ({how}); record that window: {suggestion}"


def _ranges(indices: list[int]) -> list[list[int]]:
    """[1, 2, 3, 7] → [[1, 3], [7, 7]]: compact for the meta JSON."""
    out: list[list[int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out
