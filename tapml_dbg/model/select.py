"""THE one parser of op selectors: the REPL, the engine and `record --window` all use it.

It works on a plain op table (a name, a layer and a generation step per op index), so the recorder
can use it on op-table dicts before any Session exists. Pure Python: no tvm, no torch.

Rules (docs/repl.md, "Selecting ops", says the same for users):

- `12` or `#12`: op 12. `-1` or `#-1`: the last op, counted from the end like Python. An index
  outside the ops is an error naming the valid range.
- `a:b`: ops a..b-1 (b excluded). Either bound may be omitted (`:5`, `20:`, `:`) or negative
  (`-3:` is the last three ops), with an optional `#` (`#3:#7`). A bound beyond the ends
  (`0:999` or `-100:2` on 26 ops: each bound is from -26 to 26) is an error naming the op count
  and the range to write, never clamped silently; so is a range that selects no op (`5:3`, `0:0`).
- `@K` (a generation trace, `record --generate N`): every op of step K (0 = the prefill, 1..N the
  decode steps; `@-1` is the last step). `@K/SEL`: the ops SEL selects that are in step K
  (`@2/model.layers.1`: that layer's ops in decode step 2; the graph unrolls every step, so a
  layer path alone selects it in every step). On a trace without steps, or with a step outside
  them, an error names the valid steps; so does an `@K/SEL` whose SEL has no op in step K.
- otherwise an exact op name (`gelu_1`);
- otherwise a layer path (`blocks.1`): the ops of that layer and of every layer nested in it
  (`op.layer == L or op.layer.startswith(L + ".")`);
- otherwise an error with the closest op names and layers.

Precedence, when a text could be read two ways: a step prefix (`@`, which no op name or layer
holds) and index/range syntax first, then an op name, then a layer (so `0` is op 0 even if a
layer is called `0`).
`select_many` takes several selectors separated by commas and returns the union, sorted (a
step prefix scopes one selector: `@2/blocks.0,@2/blocks.3`).
Every error is a `UsageError` whose message says what to type instead.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from tapml_dbg.errors import UsageError
from tapml_dbg.model.generation import PREFILL_STEP

OP, RANGE, LAYER, STEP = "op", "range", "layer", "step"  # Selection.kind
CLOSE_MATCHES = 3  # names suggested for a typo
LAYER_SEP = "."  # nn.Module path separator: `blocks.1.fc` is nested in `blocks.1`
SELECTOR_SEP = ","  # select_many: `0:5,9`, `blocks.0,blocks.3`
INDEX_MARK = "#"  # optional prefix of an index: `#12`
STEP_MARK = "@"  # a generation step: `@2`
STEP_SCOPE = "/"  # a selector inside a step: `@2/model.layers.1`

_INDEX = r"#?-?\d+"
_INDEX_RE = re.compile(rf"\s*({_INDEX})\s*")
_RANGE_RE = re.compile(rf"\s*({_INDEX})?\s*:\s*({_INDEX})?\s*")
_STEP_RE = re.compile(rf"\s*{STEP_MARK}\s*(-?\d+)\s*(?:{STEP_SCOPE}(.*))?", re.DOTALL)


@dataclass(frozen=True)
class Selection:
    """What one selector picked: sorted op indices and a label saying what they are."""

    kind: str  # OP, RANGE, LAYER or STEP
    indices: tuple[int, ...]  # ascending, never empty
    label: str  # the op name, the range as `first:end`, the layer path, or `@K` / `@K/LABEL`

    @property
    def first(self) -> int:
        return self.indices[0]

    @property
    def end(self) -> int:
        """One past the last op: `first:end` spans the selection (a layer's ops may have gaps)."""
        return self.indices[-1] + 1


def is_index(text: str | int) -> bool:
    """Whether `text` is one index (`12`, `#12`, `-1`): `boundary K` tells a count from a layer so."""
    return isinstance(text, int) or bool(_INDEX_RE.fullmatch(str(text)))


def is_step(text: str) -> bool:
    """Whether `text` is a step selector (`@2`, `@2/model.layers.1`)."""
    return bool(_STEP_RE.fullmatch(str(text)))


def is_positional(text: str) -> bool:
    """Whether `text` is index, range or step syntax (comma-separated allowed), not a name or layer.

    `ops` uses it to tell a selector from a search pattern.
    """
    parts = str(text).split(SELECTOR_SEP)
    return all(is_index(part) or _RANGE_RE.fullmatch(part) or is_step(part) for part in parts)


class OpTable:
    """The op names, layers and steps of one trace, built once; every selector is resolved here."""

    def __init__(self, names: list[str], layers: list[str], listing: str | None = None,
                 steps: list[int | None] | None = None):
        """`listing`: how the user lists ops and layers where the REPL's `ops`/`layers` do not exist;
        `steps`: each op's generation step (None, or all None: not a generation trace)."""
        steps = list(steps) if steps is not None else [None] * len(names)
        if not len(names) == len(layers) == len(steps):
            raise ValueError(f"{len(names)} op names but {len(layers)} layers and {len(steps)} steps")
        self.names = list(names)
        self.op_layers = [layer or "" for layer in layers]
        self.op_steps = steps
        self._by_name = {name: index for index, name in enumerate(self.names)}
        self._layers = _all_layers(self.op_layers)
        self._steps: dict[int, list[int]] = {}  # step -> its ops, in order
        for index, step in enumerate(steps):
            if step is not None:
                self._steps.setdefault(step, []).append(index)
        self.listing = listing

    @classmethod
    def of(cls, ops, listing: str | None = None) -> "OpTable":
        """From OpInfo objects (`.name`, `.layer`, `.step`) or op-table dicts (`"name"`, `"layer"`,
        `"step"`), in index order."""
        return cls([_field(op, "name") for op in ops], [_field(op, "layer", "") or "" for op in ops], listing,
                   [_field(op, "step", None) for op in ops])

    def __len__(self) -> int:
        return len(self.names)

    # ------------------------------------------------------------ layers
    def layers(self) -> list[str]:
        """Every layer path and every prefix of it, in first-seen order."""
        return list(self._layers)

    def layer_ops(self, layer: str) -> list[int]:
        """The ops of `layer` and of every layer nested in it."""
        indices = self._in_layer(layer)
        if not indices:
            hint = self._hint(layer, self._layers, "`layers` lists them")
            raise UsageError(f"no layer named {layer!r}{hint}")
        return indices

    # ------------------------------------------------------------ steps
    def steps(self) -> list[int]:
        """The generation steps the ops belong to, ascending ([] outside a generation trace)."""
        return sorted(self._steps)

    def step_ops(self, step: int) -> list[int]:
        """The ops of generation step `step` (negative: counted from the last step)."""
        return list(self._steps[self._step(step, f"{STEP_MARK}{step}")])

    # ------------------------------------------------------------ ops
    def op(self, text: str | int) -> int:
        """One op: an index (`12`, `#12`, `-1`) or an exact name."""
        if is_index(text):
            return self._index(str(text))
        if text in self._by_name:
            return self._by_name[text]
        hint = self._hint(text, self.names, "`ops PATTERN` lists op names")
        raise UsageError(f"no op named {text!r}{hint}")

    def select(self, text: str) -> Selection:
        """One selector of any kind, by the rules in the module docstring."""
        text = str(text).strip()
        if not text:
            raise UsageError("empty selector: give an op (`12`, `-1`, a name), a range `a:b` or a layer")
        if is_index(text):
            index = self._index(text)
            return Selection(OP, (index,), self.names[index])
        match = _STEP_RE.fullmatch(text)
        if match:
            return self._in_step(text, int(match.group(1)), match.group(2))
        match = _RANGE_RE.fullmatch(text)
        if match:
            return self._range(text, *match.groups())
        if text in self._by_name:
            return Selection(OP, (self._by_name[text],), text)
        indices = self._in_layer(text)
        if indices:
            return Selection(LAYER, tuple(indices), text)
        hint = self._hint(text, self.names + self._layers, "`ops` and `layers` list them")
        raise UsageError(f"no op or layer named {text!r}{hint}")

    def select_many(self, text: str) -> list[int]:
        """Comma-separated selectors (`0:5,9`, `blocks.0,blocks.3`): the union, sorted."""
        chosen: set[int] = set()
        for part in str(text).split(SELECTOR_SEP):
            chosen.update(self.select(part).indices)
        return sorted(chosen)

    # ------------------------------------------------------------ internals
    def _valid(self) -> str:
        return f"0..{len(self) - 1}" if len(self) else "none: the trace has no ops"

    def _index(self, text: str) -> int:
        index = int(text.strip().lstrip(INDEX_MARK))
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise UsageError(f"op index {text.strip()} is out of range ({self._valid()})")
        return position

    def _range(self, text: str, start: str | None, stop: str | None) -> Selection:
        count, low, high = len(self), _bound(start), _bound(stop)
        if any(bound is not None and not -count <= bound <= count for bound in (low, high)):
            raise UsageError(self._out_of_range(text.strip(), low, high))
        bounds = slice(low, high).indices(count)
        indices = tuple(range(*bounds))
        if not indices:
            raise UsageError(f"`{text}` selects no op (ops are {self._valid()}); give a:b with a < b")
        return Selection(RANGE, indices, f"{indices[0]}:{indices[-1] + 1}")

    def _out_of_range(self, text: str, low: int | None, high: int | None) -> str:
        """A bound past the ends: the op count and the range the user most likely meant."""
        count = len(self)
        if not count:
            return f"`{text}` selects no op: the trace has no ops"
        first, end, _step = slice(low, high).indices(count)
        if first >= end:
            first, end = 0, count
        open_end = f"`{first or ''}:`"  # the same range written to the last op
        return (f"`{text}` is out of range: the trace has {count} ops ({self._valid()}), so each bound of a:b is "
                f"from -{count} to {count} (b excluded); write `{first}:{end}`"
                + (f" (or {open_end} to the last op)" if end == count else ""))

    def _step(self, step: int, text: str) -> int:
        """A step number as typed (`-1`: the last) -> the step, or an error naming the valid steps."""
        steps = self.steps()
        if not steps:
            raise UsageError(f"`{text}`: not a generation trace: its ops have no step; `{STEP_MARK}K` selects "
                             "step K of a trace recorded with --generate N (docs/generation.md)")
        position = step + len(steps) if step < 0 else step
        if position not in self._steps:
            raise UsageError(f"`{text}`: step {step} is out of range: the trace has steps {self._valid_steps()}")
        return position

    def _valid_steps(self) -> str:
        """`0..3 (0 is the prefill, 1..3 decode; @-1 is the last)`."""
        steps = self.steps()
        first, last = steps[0], steps[-1]
        decode = f", {_span(first + 1, last)} decode" if first == PREFILL_STEP and last > first else ""
        prefill = f"{PREFILL_STEP} is the prefill{decode}; " if first == PREFILL_STEP else ""
        return f"{_span(first, last)} ({prefill}{STEP_MARK}-1 is the last)"

    def _in_step(self, text: str, step: int, scoped: str | None) -> Selection:
        """`@K` or `@K/SEL`: the step's ops, or those of SEL in it."""
        step = self._step(step, text.strip())
        in_step = self._steps[step]
        label = f"{STEP_MARK}{step}"
        if scoped is None:
            return Selection(STEP, tuple(in_step), label)
        if not scoped.strip():
            raise UsageError(f"`{text.strip()}`: nothing after `{label}{STEP_SCOPE}`: give an op, a range or a "
                             f"layer in the step (`{label}{STEP_SCOPE}LAYER`), or `{label}` for all of it")
        inner = self.select(scoped)
        chosen = set(in_step)
        indices = tuple(index for index in inner.indices if index in chosen)
        if not indices:
            found = sorted({self.op_steps[index] for index in inner.indices} - {None})
            where = f"step {', '.join(map(str, found))}" if found else "no step"
            raise UsageError(f"`{text.strip()}` selects no op: {inner.label} is in {where}, not step {step} "
                             f"(ops {in_step[0]}..{in_step[-1]})")
        return Selection(STEP, indices, f"{label}{STEP_SCOPE}{inner.label}")

    def _hint(self, text: str, candidates: list[str], listing: str) -> str:
        """`; did you mean a, b?` from the closest candidates, else how to list them."""
        close = difflib.get_close_matches(str(text), candidates, n=CLOSE_MATCHES)
        return f"; did you mean {', '.join(close)}?" if close else f"; {self.listing or listing}"

    def _in_layer(self, layer: str) -> list[int]:
        if not layer:
            return []
        nested = layer + LAYER_SEP
        return [index for index, path in enumerate(self.op_layers) if path == layer or path.startswith(nested)]


_REQUIRED = object()  # _field: no default, the field must be there


def _field(op, name: str, default=_REQUIRED):
    """A field of an OpInfo or of an op-table dict (old dicts may lack `layer` and `step`)."""
    if isinstance(op, dict):
        return op[name] if default is _REQUIRED else op.get(name, default)
    return getattr(op, name) if default is _REQUIRED else getattr(op, name, default)


def _span(first: int, last: int) -> str:
    """`1..3`, or `1` for one."""
    return f"{first}..{last}" if last != first else str(first)


def _bound(text: str | None) -> int | None:
    return None if text is None else int(text.lstrip(INDEX_MARK))


def _all_layers(op_layers: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for path in op_layers:
        parts = path.split(LAYER_SEP) if path else []
        for end in range(1, len(parts) + 1):
            seen.setdefault(LAYER_SEP.join(parts[:end]), None)
    return list(seen)
