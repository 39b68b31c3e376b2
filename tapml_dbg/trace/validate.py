"""The trace's schema as checks: every JSON value read from a trace passes here first.

A trace is a file people pass around, so what it holds is untrusted: a bit flip, a cut, or a
crafted edit can put any JSON where the program expects an op table. The reader parses each
text with `parse_json` (bounded nesting) and hands it to one `validate_*` function, which
returns a value the rest of the program can rely on (types, required keys, ranges; optional
op-table keys filled with their defaults) or raises `SchemaError` naming the part. The
reader turns a `SchemaError` into a `TraceError` with the file's name and what to do.

Pure functions over JSON values: no h5py here (that boundary is `h5safe.py`).
"""

from __future__ import annotations

import json
import re

from tapml_dbg.trace import schema as S
from tapml_dbg.trace.stats import STATS_FIELDS

_OP_NAME = re.compile(S.OP_NAME_PATTERN)
_OP_TEXT = re.compile(S.OP_TEXT_PATTERN)
_SOURCE_UNPRINTABLE = re.compile(S.SOURCE_UNPRINTABLE)


class SchemaError(ValueError):
    """A value read from a trace breaks the schema: `part` is what it was, `detail` what is wrong."""

    def __init__(self, part: str, detail: str):
        super().__init__(f"{part}: {detail}")
        self.part = part
        self.detail = detail


# ---- JSON text ------------------------------------------------------------------------------

def parse_json(text: str, part: str, max_depth: int = S.MAX_JSON_DEPTH):
    """Parse `text` as JSON no deeper than `max_depth` (NaN and Infinity are accepted: the writer
    stores Python floats), or raise SchemaError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise SchemaError(part, f"JSON nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as exc:
        raise SchemaError(part, f"not valid JSON ({_first_line(exc)})") from None
    if json_depth(value) > max_depth:
        raise SchemaError(part, f"JSON nested deeper than {max_depth} levels")
    return value


def json_depth(value) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


# ---- scalar checks --------------------------------------------------------------------------

def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _want(ok: bool, part: str, where: str, expected: str, value) -> None:
    if not ok:
        raise SchemaError(part, f"{where} must be {expected}, not {_type_name(value)}")


def _int(value, part: str, where: str, low: int = 0, high: int = S.MAX_DIM) -> int:
    _want(is_int(value), part, where, "an integer", value)
    if not low <= value <= high:
        raise SchemaError(part, f"{where} is {value}, outside {low}..{high}")
    return value


def _str(value, part: str, where: str) -> str:
    _want(isinstance(value, str), part, where, "a string", value)
    return value


def _optional(check, value, part: str, where: str):
    return None if value is None else check(value, part, where)


def _number(value, part: str, where: str) -> float | int:
    _want(is_number(value), part, where, "a number", value)
    return value


def _str_list(value, part: str, where: str) -> list[str]:
    _want(isinstance(value, list), part, where, "a list of strings", value)
    for k, item in enumerate(value):
        _str(item, part, f"{where}[{k}]")
    return list(value)


# ---- meta -----------------------------------------------------------------------------------

# meta keys the program reads, and their checks; any other key is free form (bounded nesting only)
_META_FIELDS = {
    "model": lambda v, p, w: _optional(_str, v, p, w),
    "source": lambda v, p, w: _optional(_str, v, p, w),
    "created": lambda v, p, w: _optional(_str, v, p, w),
    "record_seconds": lambda v, p, w: _optional(_number, v, p, w),
    "eager_seconds": lambda v, p, w: _optional(_number, v, p, w),
    "eager_output_max_abs_diff": lambda v, p, w: _optional(_number, v, p, w),
    "import_fixes": _str_list,
    S.META_STOCK_IMPORT: lambda v, p, w: _optional(_stock_import, v, p, w),
    S.META_CAUSAL_LM: lambda v, p, w: _optional(_causal_lm, v, p, w),
    S.META_GENERATION: lambda v, p, w: _optional(_generation, v, p, w),
    S.META_HOST_ONLY: lambda v, p, w: _optional(_host_only, v, p, w),
    "inputs": _str_list,
    "params": _str_list,
    "outputs": _str_list,
}
META_PART = "the trace's meta"
CAPTURE_PART = "the capture budget (meta 'capture')"


def validate_meta(value) -> dict:
    """The root `@meta` object, its known keys type-checked (`versions`: names to strings)."""
    part = META_PART
    _want(isinstance(value, dict), part, "meta", "an object", value)
    meta = dict(value)
    for key, check in _META_FIELDS.items():
        if key in meta:
            check(meta[key], part, repr(key))
    if "versions" in meta:
        versions = meta["versions"]
        _want(isinstance(versions, dict), part, "'versions'", "an object", versions)
        for name, version in versions.items():
            _want(version is None or isinstance(version, str), part, f"'versions'[{name!r}]", "a string", version)
    if meta.get(S.META_CAPTURE) is not None:
        meta[S.META_CAPTURE] = validate_capture(meta[S.META_CAPTURE])
    return meta


def validate_capture(value) -> dict:
    """meta `capture` (see capture.CapturePlan.to_meta): every key present, typed; ranges ordered.

    Ranges against the op table are `check_capture_ops`'s: the meta is read before the op table.
    """
    part = CAPTURE_PART
    _want(isinstance(value, dict), part, "capture", "an object", value)
    first = _int(value.get("first"), part, "'first'")
    end = _int(value.get("end"), part, "'end'")
    if end < first:
        raise SchemaError(part, f"window end {end} is before its first op {first}")
    stored = value.get("stored", [])
    _want(isinstance(stored, list), part, "'stored'", "a list of [first, last] ranges", stored)
    ranges = []
    for k, pair in enumerate(stored):
        ok = isinstance(pair, list) and len(pair) == 2 and all(is_int(i) for i in pair)
        _want(ok, part, f"'stored'[{k}]", "a [first, last] pair of integers", pair)
        if not 0 <= pair[0] <= pair[1] <= S.MAX_DIM:
            raise SchemaError(part, f"'stored'[{k}] = {pair} is not an ordered range of op indices")
        ranges.append([pair[0], pair[1]])
    truncated = value.get("truncated", False)
    _want(isinstance(truncated, bool), part, "'truncated'", "a boolean", truncated)
    return {
        "window": _optional(_str, value.get("window"), part, "'window'"),
        "max_bytes": _optional(_int, value.get("max_bytes"), part, "'max_bytes'"),
        "first": first, "end": end,
        "layer": _optional(_str, value.get("layer"), part, "'layer'"),
        "stored": ranges,
        "stored_bytes": _int(value.get("stored_bytes", 0), part, "'stored_bytes'"),
        "truncated": truncated,
    }


def check_capture_ops(capture: dict | None, num_ops: int) -> None:
    """The capture window and its stored ranges lie inside an op table of `num_ops` ops."""
    if capture is None:
        return
    if capture["end"] > num_ops:
        raise SchemaError(CAPTURE_PART, f"window ops {capture['first']}..{capture['end'] - 1} run past the "
                                        f"op table's {num_ops} ops")
    for first, last in capture["stored"]:
        if last >= num_ops:
            raise SchemaError(CAPTURE_PART, f"stored ops {first}..{last} run past the op table's {num_ops} ops")


# ---- op table -------------------------------------------------------------------------------

OP_TABLE_PART = "the op table"


def validate_op_table(value) -> list[dict]:
    """The op table: entry i has index i and a unique name; known keys typed, defaults filled."""
    part = OP_TABLE_PART
    _want(isinstance(value, list), part, "the op table", "a list", value)
    ops = []
    names: set[str] = set()
    for position, entry in enumerate(value):
        where = f"op {position}"
        _want(isinstance(entry, dict), part, where, "an object", entry)
        for key in S.OP_REQUIRED_FIELDS:
            if key not in entry:
                raise SchemaError(part, f"{where} has no {key!r}")
        if entry["index"] != position or not is_int(entry["index"]):
            raise SchemaError(part, f"{where} says it is op {entry['index']!r}")
        name = _name(entry["name"], part, f"{where}'s 'name'")
        if name in names:
            raise SchemaError(part, f"{where}'s name {name!r} is used by an earlier op")
        names.add(name)
        op = {"index": position, "name": name}
        for key, default in S.OP_OPTIONAL_FIELDS.items():
            op[key] = entry.get(key, default)
        for key in ("op", "relax_op", "layer", "fx_node"):
            _str(op[key], part, f"{where}'s {key!r}")
            if not _OP_TEXT.fullmatch(op[key]):
                raise SchemaError(part, f"{where}'s {key!r} is {op[key][:40]!r}: not one line of text without "
                                        "quotes")
        _want(isinstance(op["inputs"], list), part, f"{where}'s 'inputs'", "a list of names", op["inputs"])
        op["inputs"] = [_name(item, part, f"{where}'s 'inputs'[{k}]") for k, item in enumerate(op["inputs"])]
        _want(isinstance(op["is_tuple"], bool), part, f"{where}'s 'is_tuple'", "a boolean", op["is_tuple"])
        op["outputs"] = _output_specs(op["outputs"], part, f"{where}'s 'outputs'")
        op["source_location"] = _optional(_source_location, op["source_location"], part,
                                          f"{where}'s 'source_location'")
        op["stock_outputs"] = _stock_outputs(op["stock_outputs"], len(op["outputs"]), part,
                                             f"{where}'s 'stock_outputs'")
        op["step"] = _optional(_int, op["step"], part, f"{where}'s 'step'")
        ops.append(op)
    return ops


def _source_location(value, part: str, where: str, nested: bool = False) -> dict:
    """`{"file", "line", "code"}`: texts of one line each (quotes allowed: code has them), a line >= 1;
    a library's line adds `"library"` (a package name) and `"user"` (null, or the user's frame in the
    same form, without a `library` of its own)."""
    _want(isinstance(value, dict), part, where, 'an object {"file", "line", "code"}', value)
    location = {"file": value.get("file"), "line": value.get("line"), "code": value.get("code", "")}
    for key, limit in (("file", S.SOURCE_FILE_MAX_CHARS), ("code", S.SOURCE_CODE_MAX_CHARS)):
        text = _str(location[key], part, f"{where}'s {key!r}")
        if len(text) > limit or _SOURCE_UNPRINTABLE.search(text) or (key == "file" and not text):
            raise SchemaError(part, f"{where}'s {key!r} is {text[:40]!r}: not one line of at most {limit} "
                                    "printable characters")
    _int(location["line"], part, f"{where}'s 'line'", low=1)
    if value.get("library") is not None and not nested:
        location["library"] = _name(value["library"], part, f"{where}'s 'library'")
        location["user"] = _optional(lambda v, p, w: _source_location(v, p, w, nested=True), value.get("user"),
                                     part, f"{where}'s 'user'")
    return location


def _stock_outputs(value, outputs: int, part: str, where: str) -> list[dict]:
    """`[{"output": k, "shape", "dtype"}]`: k names one of the op's outputs, each at most once."""
    _want(isinstance(value, list), part, where, 'a list of {"output", "shape", "dtype"}', value)
    found, seen = [], set()
    for k, item in enumerate(value):
        here = f"{where}[{k}]"
        _want(isinstance(item, dict), part, here, 'an object {"output", "shape", "dtype"}', item)
        output = _int(item.get("output"), part, f"{here}'s 'output'", high=max(outputs - 1, 0))
        if output in seen or output >= outputs:
            raise SchemaError(part, f"{here} names output {output} of an op of {outputs} output(s), or twice")
        seen.add(output)
        found.append({"output": output, **_output_specs([item], part, here)[0]})
    return found


def _stock_import(value, part: str, where: str) -> dict:
    """Meta `stock_import` (schema.META_STOCK_IMPORT): its texts one line, its lists of names."""
    _want(isinstance(value, dict), part, where, "an object", value)
    found = dict(value)
    found["fixes"] = _str_list(value.get("fixes", []), part, f"{where}'s 'fixes'")
    found["changed_ops"] = _str_list(value.get("changed_ops", []), part, f"{where}'s 'changed_ops'")
    for key in ("error", "error_node", "error_op", "reason"):
        text = _optional(_str, value.get(key), part, f"{where}'s {key!r}")
        if text is not None and (len(text) > S.STOCK_ERROR_MAX_CHARS or _SOURCE_UNPRINTABLE.search(text)):
            raise SchemaError(part, f"{where}'s {key!r} is not one line of at most {S.STOCK_ERROR_MAX_CHARS} "
                                    "printable characters")
        found[key] = text
    return found


def _host_only(value, part: str, where: str) -> list:
    """Meta `host_only` (schema.META_HOST_ONLY): one object per op TVM cannot import, its reason one line."""
    _want(isinstance(value, list), part, where, "a list", value)
    for k, item in enumerate(value):
        here = f"{where}[{k}]"
        _want(isinstance(item, dict), part, here, 'an object {"index", "name", "op", "reason"}', item)
        _int(item.get("index"), part, f"{here}'s 'index'")
        _name(item.get("name"), part, f"{here}'s 'name'")
        for key in ("op", "reason"):
            text = _str(item.get(key), part, f"{here}'s {key!r}")
            if len(text) > S.HOST_ONLY_REASON_MAX_CHARS or _SOURCE_UNPRINTABLE.search(text):
                raise SchemaError(part, f"{here}'s {key!r} is not one line of at most "
                                        f"{S.HOST_ONLY_REASON_MAX_CHARS} printable characters")
    return list(value)


def _causal_lm(value, part: str, where: str) -> dict:
    """Meta `causal_lm` (schema.META_CAUSAL_LM): how an unwrapped transformers causal LM was driven."""
    _want(isinstance(value, dict), part, where, "an object", value)
    found = dict(value)
    for key in ("class", "mask"):
        text = _str(value.get(key), part, f"{where}'s {key!r}")
        if len(text) > S.CAUSAL_LM_TEXT_MAX_CHARS or _SOURCE_UNPRINTABLE.search(text):
            raise SchemaError(part, f"{where}'s {key!r} is not one line of at most {S.CAUSAL_LM_TEXT_MAX_CHARS} "
                                    "printable characters")
    for key in ("batch", "positions"):
        found[key] = _int(value.get(key), part, f"{where}'s {key!r}")
    _want(isinstance(value.get("position_ids", False), bool), part, f"{where}'s 'position_ids'", "a boolean",
          value.get("position_ids"))
    return found


def _generation(value, part: str, where: str) -> dict:
    """Meta `generation` (schema.META_GENERATION): the steps, numbered 0.. in order, their positions
    half-open and contiguous, a prefill first and decode steps after it."""
    _want(isinstance(value, dict), part, where, "an object", value)
    found = dict(value)
    text = _str(value.get("class", ""), part, f"{where}'s 'class'")
    if len(text) > S.CAUSAL_LM_TEXT_MAX_CHARS or _SOURCE_UNPRINTABLE.search(text):
        raise SchemaError(part, f"{where}'s 'class' is not one line of at most {S.CAUSAL_LM_TEXT_MAX_CHARS} "
                                "printable characters")
    found["prompt"] = _int(value.get("prompt"), part, f"{where}'s 'prompt'", low=1)
    _name(value.get("input", ""), part, f"{where}'s 'input'")
    steps = value.get("steps")
    _want(isinstance(steps, list) and steps, part, f"{where}'s 'steps'", "a non-empty list", steps)
    end = 0
    for k, step in enumerate(steps):
        here = f"{where}'s 'steps'[{k}]"
        _want(isinstance(step, dict), part, here, 'an object {"step", "kind", "positions", "token"}', step)
        kind = "prefill" if k == 0 else "decode"
        if step.get("step") != k or step.get("kind") != kind:
            raise SchemaError(part, f"{here} must be step {k}, a {kind}")
        positions = step.get("positions")
        _want(isinstance(positions, list) and len(positions) == 2, part, f"{here}'s 'positions'",
              "[start, end)", positions)
        start = _int(positions[0], part, f"{here}'s 'positions'[0]")
        stop = _int(positions[1], part, f"{here}'s 'positions'[1]")
        if start != end or stop <= start:
            raise SchemaError(part, f"{here}'s positions [{start}, {stop}) do not follow [.., {end})")
        end = stop
        _int(step.get("token"), part, f"{here}'s 'token'")
    return found


def _name(value, part: str, where: str) -> str:
    _want(isinstance(value, str), part, where, "a string", value)
    if not _OP_NAME.fullmatch(value):
        raise SchemaError(part, f"{where} is {value[:40]!r}, not an identifier")
    return value


def _output_specs(value, part: str, where: str) -> list[dict]:
    _want(isinstance(value, list), part, where, "a list", value)
    specs = []
    for k, spec in enumerate(value):
        here = f"{where}[{k}]"
        _want(isinstance(spec, dict), part, here, 'an object {"shape", "dtype"}', spec)
        specs.append({"shape": validate_shape(spec.get("shape"), part, f"{here}'s 'shape'"),
                      "dtype": validate_dtype(spec.get("dtype"), part, f"{here}'s 'dtype'")})
    return specs


def validate_shape(value, part: str, where: str) -> list[int]:
    _want(isinstance(value, list), part, where, "a list of dimensions", value)
    if len(value) > S.MAX_NDIM:
        raise SchemaError(part, f"{where} has {len(value)} dimensions (at most {S.MAX_NDIM})")
    return [_int(dim, part, f"{where}[{k}]") for k, dim in enumerate(value)]


def validate_dtype(value, part: str, where: str) -> str:
    _str(value, part, where)
    if value not in S.SUPPORTED_DTYPES:
        raise SchemaError(part, f"{where} is {value[:40]!r}, a dtype this tapml-dbg does not know "
                                "(a newer trace: upgrade tapml-dbg)")
    return value


# ---- stats ----------------------------------------------------------------------------------

def validate_stats(value, part: str) -> dict:
    """One tensor's stats object (stats.STATS_FIELDS): counts are integers, the rest numbers or null."""
    _want(isinstance(value, dict), part, "stats", "an object", value)
    out = {}
    for key in STATS_FIELDS:
        if key not in value:
            raise SchemaError(part, f"stats have no {key!r}")
        item = value[key]
        if key in ("nan", "inf", "numel"):
            out[key] = _int(item, part, f"stats {key!r}")
        else:
            out[key] = _optional(_number, item, part, f"stats {key!r}")
    return out


def validate_stats_list(value, part: str) -> list[dict]:
    """A stats-only op's `@stats`: one stats object per output."""
    _want(isinstance(value, list), part, "stats", "a list", value)
    return [validate_stats(item, f"{part} (output {k})") for k, item in enumerate(value)]


# ---- the graph against the op table ---------------------------------------------------------

GRAPH_PART = "the graph"


def check_graph_matches(graph: dict, ops: list[dict], values: set[str]) -> None:
    """The graph's bindings are the op table's ops, in order, and read only known values.

    `graph` passed `model.serialize.check_graph`; `values` are the trace's input and param names.
    """
    bindings = [binding["name"] for binding in graph["bindings"]]
    names = [op["name"] for op in ops]
    if bindings != names:
        at = next((k for k, (a, b) in enumerate(zip(bindings, names)) if a != b), min(len(bindings), len(names)))
        raise SchemaError(GRAPH_PART, f"its bindings do not match the op table (first difference at op {at}; "
                                      f"{len(bindings)} bindings, {len(names)} ops)")
    params = [param["name"] for param in graph["params"]]
    unknown = [name for name in params if name not in values]
    if unknown:
        raise SchemaError(GRAPH_PART, f"it reads {unknown[0]!r}, which is neither an input nor a param of the trace")
    known = set(params)
    for op in ops:
        for name in op["inputs"]:
            if name not in known:
                raise SchemaError(OP_TABLE_PART, f"op {op['index']} reads {name!r}, which no earlier op, input "
                                                 "or param defines")
        known.add(op["name"])


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
