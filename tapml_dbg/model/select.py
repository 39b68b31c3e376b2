"""THE one parser of op selectors: the REPL, the engine and `record --window` all use it.

It works on a plain op table (a name and a layer per op index), so the recorder can use it on
op-table dicts before any Session exists. Pure Python: no tvm, no torch.

Rules (docs/repl.md, "Selecting ops", says the same for users):

- `12` or `#12`: op 12. `-1` or `#-1`: the last op, counted from the end like Python. An index
  outside the ops is an error naming the valid range.
- `a:b`: ops a..b-1 (b excluded). Either bound may be omitted (`:5`, `20:`, `:`) or negative
  (`-3:` is the last three ops), with an optional `#` (`#3:#7`). A bound beyond the ends
  (`0:999` or `-100:2` on 26 ops: each bound is from -26 to 26) is an error naming the op count
  and the range to write, never clamped silently; so is a range that selects no op (`5:3`, `0:0`).
- otherwise an exact op name (`gelu_1`);
- otherwise a layer path (`blocks.1`): the ops of that layer and of every layer nested in it
  (`op.layer == L or op.layer.startswith(L + ".")`);
- otherwise an error with the closest op names and layers.

Precedence, when a text could be read two ways: index/range syntax first, then an op name,
then a layer (so `0` is op 0 even if a layer is called `0`).
`select_many` takes several selectors separated by commas and returns the union, sorted.
Every error is a `UsageError` whose message says what to type instead.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from tapml_dbg.errors import UsageError

OP, RANGE, LAYER = "op", "range", "layer"  # Selection.kind
CLOSE_MATCHES = 3  # names suggested for a typo
LAYER_SEP = "."  # nn.Module path separator: `blocks.1.fc` is nested in `blocks.1`
SELECTOR_SEP = ","  # select_many: `0:5,9`, `blocks.0,blocks.3`
INDEX_MARK = "#"  # optional prefix of an index: `#12`

_INDEX = r"#?-?\d+"
_INDEX_RE = re.compile(rf"\s*({_INDEX})\s*")
_RANGE_RE = re.compile(rf"\s*({_INDEX})?\s*:\s*({_INDEX})?\s*")


@dataclass(frozen=True)
class Selection:
    """What one selector picked: sorted op indices and a label saying what they are."""

    kind: str  # OP, RANGE or LAYER
    indices: tuple[int, ...]  # ascending, never empty
    label: str  # the op name, the range as `first:end`, or the layer path

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


def is_positional(text: str) -> bool:
    """Whether `text` is index or range syntax (comma-separated allowed), not a name or layer.

    `ops` uses it to tell a selector from a search pattern.
    """
    parts = str(text).split(SELECTOR_SEP)
    return all(is_index(part) or _RANGE_RE.fullmatch(part) for part in parts)


class OpTable:
    """The op names and layers of one trace, built once; every selector is resolved here."""

    def __init__(self, names: list[str], layers: list[str], listing: str | None = None):
        """`listing`: how the user lists ops and layers where the REPL's `ops`/`layers` do not exist."""
        if len(names) != len(layers):
            raise ValueError(f"{len(names)} op names but {len(layers)} layers")
        self.names = list(names)
        self.op_layers = [layer or "" for layer in layers]
        self._by_name = {name: index for index, name in enumerate(self.names)}
        self._layers = _all_layers(self.op_layers)
        self.listing = listing

    @classmethod
    def of(cls, ops, listing: str | None = None) -> "OpTable":
        """From OpInfo objects (`.name`, `.layer`) or op-table dicts (`"name"`, `"layer"`), in index order."""
        return cls([_field(op, "name") for op in ops], [_field(op, "layer", "") or "" for op in ops], listing)

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

    def _hint(self, text: str, candidates: list[str], listing: str) -> str:
        """`; did you mean a, b?` from the closest candidates, else how to list them."""
        close = difflib.get_close_matches(str(text), candidates, n=CLOSE_MATCHES)
        return f"; did you mean {', '.join(close)}?" if close else f"; {self.listing or listing}"

    def _in_layer(self, layer: str) -> list[int]:
        if not layer:
            return []
        nested = layer + LAYER_SEP
        return [index for index, path in enumerate(self.op_layers) if path == layer or path.startswith(nested)]


def _field(op, name: str, default=None):
    """A field of an OpInfo or of an op-table dict (old dicts may lack `layer`)."""
    if isinstance(op, dict):
        return op[name] if default is None else op.get(name, default)
    return getattr(op, name) if default is None else getattr(op, name, default)


def _bound(text: str | None) -> int | None:
    return None if text is None else int(text.lstrip(INDEX_MARK))


def _all_layers(op_layers: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for path in op_layers:
        parts = path.split(LAYER_SEP) if path else []
        for end in range(1, len(parts) + 1):
            seen.setdefault(LAYER_SEP.join(parts[:end]), None)
    return list(seen)
