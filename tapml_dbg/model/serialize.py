"""Data-only serialization of a Relax `main` to JSON, and back.

TVM 0.27's `tvm.ir.save_json` segfaults in this wheel, and TVMScript is code (parsing it
evaluates Python), so a trace stores the graph in this small format instead: bindings of
op calls, attrs as plain fields, constants as base64 bytes. Loading it only calls TVM
constructors; nothing from the file is executed.

A stored graph is untrusted: `check_graph` checks its structure (keys, types, references,
sizes, op names) without TVM, before anything is built from it, and `function_from_json`
turns whatever TVM still refuses into a `TraceError`.
"""

from __future__ import annotations

import base64
import math
import re
import threading

import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.model.host_only import is_host_only_call, placeholder
from tapml_dbg.model.paged_kv import call_parts, is_paged_kv_call, paged_kv_call
from tapml_dbg.portable.paged_kv import check_config

SCHEMA = "tapml-relax-graph/1"
ALLOWED_ATTRS_PREFIX = "relax.attrs."  # a trace may only rebuild op attributes, no other TVM object
# A graph may call Relax operators only, and none that calls a function by name or touches the VM,
# memory or I/O (call_*packed, call_py_func, call_builtin_with_ctx, vm.*, memory.*, print, ...).
OP_NAME = re.compile(r"relax\.[A-Za-z0-9_.]{1,128}")
REFUSED_OPS = re.compile(r"relax\.(call_|vm\.|memory\.|builtin\.|dist\.|print$|assert_op$)")
MAX_GRAPH_DEPTH = 48  # expression nesting; the importer's graphs nest a few levels
MAX_RANK = 32
MAX_DIM = 2**62
_DTYPE = re.compile(r"[a-z][a-z0-9_]{0,31}|")  # a TVM dtype spelling ("" is void)


class GraphFormatError(ValueError):
    """A stored graph breaks the format; the message says where."""


def function_to_json(func) -> dict:
    """Serialize a Relax function made of one binding block (what the importer produces)."""
    from tvm import relax

    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
    params = [{"name": p.name, **_type_to_json(p.ty)} for p in func.params]
    bindings = []
    for block in func.body.blocks:
        for binding in block.bindings:
            entry = {"name": binding.var.name, "value": _expr_to_json(binding.value)}
            if isinstance(binding, relax.MatchCast):  # the value cast to a static type (e.g. R.nonzero's)
                entry["match_cast"] = _type_to_json(binding.ty)
            bindings.append(entry)
    return {"schema": SCHEMA, "num_input": num_input, "params": params, "bindings": bindings,
            "output": _expr_to_json(func.body.body)}


def without_names(data: dict) -> dict:
    """The function's JSON with its variables renamed by position (params `p0`.., bindings `b0`..): two
    functions that differ in names only, which TVM's structural hash does not see, are equal here."""
    names = {param["name"]: f"p{i}" for i, param in enumerate(data.get("params", []))}
    names.update((binding["name"], f"b{i}") for i, binding in enumerate(data.get("bindings", [])))

    def renamed(value):
        if isinstance(value, dict):
            if isinstance(value.get("var"), str) and len(value) == 1:
                return {"var": names.get(value["var"], value["var"])}
            return {key: (names.get(item, item) if key == "name" and isinstance(item, str) else renamed(item))
                    for key, item in value.items()}
        if isinstance(value, list):
            return [renamed(item) for item in value]
        return value

    return renamed(data)


# TVM's BlockBuilder keeps one scope stack per process: a unit built on one thread while another is
# built elsewhere breaks both ("assert BlockBuilder._stack[-1] is self"). Every builder holds this.
BUILDING = threading.RLock()


def function_from_json(data: dict):
    """Rebuild the function with a BlockBuilder, which re-infers every binding's type."""
    from tvm import relax

    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise TraceError(f"the trace's graph is not in format {SCHEMA}; record the model again")
    try:
        check_graph(data)
    except GraphFormatError as exc:
        raise TraceError(f"the trace's graph is corrupt ({exc}); record the model again") from None
    _check_ops_exist(data)  # before the builder: one left mid-function warns on stderr when destroyed
    try:
        env: dict[str, object] = {}
        params = [relax.Var(p["name"], _type_from_json(p)) for p in data["params"]]
        env.update({p.name: p for p in params})
        with BUILDING:
            builder = relax.BlockBuilder()
            with builder.function("main", params, attrs={"num_input": int(data["num_input"])}, pure=True):
                for binding in data["bindings"]:
                    value = _expr_from_json(binding["value"], env)
                    if "match_cast" in binding:
                        env[binding["name"]] = builder.match_cast(value, _type_from_json(binding["match_cast"]),
                                                                  binding["name"])
                    else:
                        env[binding["name"]] = builder.emit(value, binding["name"])
                builder.emit_func_output(_expr_from_json(data["output"], env))
            return builder.get()["main"]
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(f"the trace's graph cannot be rebuilt ({type(exc).__name__}: {_first_line(exc)}); "
                         "it was written by an incompatible TVM or is corrupt") from None


def _check_ops_exist(data: dict) -> None:
    """Every operator the (checked) graph calls is one this TVM has."""
    import tvm

    stack = [binding["value"] for binding in data["bindings"]] + [data["output"]]
    names = set()
    while stack:
        expr = stack.pop()
        if "call" in expr:
            names.add(expr["call"])
            stack.extend(expr["args"])
        elif "tuple" in expr:
            stack.extend(expr["tuple"])
        elif "host_only" in expr:
            stack.extend(expr["host_only"])
        elif "paged_kv" in expr:
            stack.extend(expr["paged_kv"])
        elif "get_item" in expr:
            stack.append(expr["get_item"])
    for name in sorted(names):
        try:
            tvm.ir.Op.get(name)
        except Exception:
            raise TraceError(f"the trace's graph calls {name[:60]!r}, an operator this TVM does not have; "
                             "record the model again with this TVM") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


# ---- structure check (no TVM) -----------------------------------------------------------------

def check_graph(data) -> None:
    """Check a stored graph's structure before TVM sees it: every key, type and reference, the
    const sizes and the op names. Raises GraphFormatError saying where."""
    if not isinstance(data, dict):
        raise GraphFormatError(f"the graph must be an object, not {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise GraphFormatError(f"the graph is not in format {SCHEMA}")
    _int_in(data.get("num_input"), "num_input", 0, 2**31)
    params = _list(data.get("params"), "params")
    if data["num_input"] > len(params):
        raise GraphFormatError(f"num_input {data['num_input']} exceeds the {len(params)} params")
    defined: set[str] = set()
    for k, param in enumerate(params):
        where = f"params[{k}]"
        _dict(param, where)
        name = _name(param.get("name"), f"{where}.name")
        _check_type(param, where, 0)
        defined.add(name)
    for k, binding in enumerate(_list(data.get("bindings"), "bindings")):
        where = f"bindings[{k}]"
        _dict(binding, where)
        name = _name(binding.get("name"), f"{where}.name")
        _check_expr(binding.get("value"), defined, f"{where} ({name})", 0)
        if "match_cast" in binding:
            _check_type(binding["match_cast"], f"{where}.match_cast", 0)
        if name in defined:
            raise GraphFormatError(f"{where} redefines {name!r}")
        defined.add(name)
    _check_expr(data.get("output"), defined, "output", 0)


def _check_expr(expr, defined: set[str], where: str, depth: int) -> None:
    if depth > MAX_GRAPH_DEPTH:
        raise GraphFormatError(f"{where}: expressions nested deeper than {MAX_GRAPH_DEPTH}")
    _dict(expr, where)
    if "var" in expr:
        name = _str(expr["var"], f"{where}.var")
        if name not in defined:
            raise GraphFormatError(f"{where} reads {name[:40]!r}, which is not defined before it")
    elif "call" in expr:
        op = _str(expr["call"], f"{where}.call")
        if not OP_NAME.fullmatch(op) or REFUSED_OPS.match(op):
            raise GraphFormatError(f"{where} calls {op[:60]!r}, which is not an operator a trace may use")
        for k, arg in enumerate(_list(expr.get("args"), f"{where}.args")):
            _check_expr(arg, defined, f"{where}.args[{k}]", depth + 1)
        attrs = expr.get("attrs")
        if attrs is not None:
            _dict(attrs, f"{where}.attrs")
            kind = _str(attrs.get("type"), f"{where}.attrs.type")
            if not kind.startswith(ALLOWED_ATTRS_PREFIX):
                raise GraphFormatError(f"{where} names attribute type {kind[:60]!r}, which is not a Relax op "
                                       "attribute")
            for name, value in _dict(attrs.get("fields"), f"{where}.attrs.fields").items():
                _check_value(value, f"{where}.attrs.{name[:40]}", depth + 1)
        for k, ty in enumerate(_list(expr.get("ty_args", []), f"{where}.ty_args")):
            _check_type(ty, f"{where}.ty_args[{k}]", depth + 1)
    elif "host_only" in expr:
        for k, arg in enumerate(_list(expr["host_only"], f"{where}.host_only")):
            _check_expr(arg, defined, f"{where}.host_only[{k}]", depth + 1)
        types = _list(expr.get("ty_args"), f"{where}.ty_args")
        if not types:
            raise GraphFormatError(f"{where}: a host-only op declares no output type")
        for k, ty in enumerate(types):
            if "tuple" in _dict(ty, f"{where}.ty_args[{k}]"):
                raise GraphFormatError(f"{where}.ty_args[{k}]: a host-only op's outputs are tensors")
            _check_type(ty, f"{where}.ty_args[{k}]", depth + 1)
    elif "paged_kv" in expr:
        _check_paged_kv(expr, defined, where, depth)
    elif "tuple" in expr:
        for k, field in enumerate(_list(expr["tuple"], f"{where}.tuple")):
            _check_expr(field, defined, f"{where}.tuple[{k}]", depth + 1)
    elif "get_item" in expr:
        _check_expr(expr["get_item"], defined, f"{where}.get_item", depth + 1)
        _int_in(expr.get("index"), f"{where}.index", 0, 2**31)
    elif "shape" in expr:
        _shape(expr["shape"], f"{where}.shape", allow_negative=True)
    elif "const" in expr:
        _check_const(expr["const"], f"{where}.const")
    elif "imm" in expr:
        _check_value(expr["imm"], f"{where}.imm", depth + 1)
    elif "str" in expr:
        _str(expr["str"], f"{where}.str")
    elif "dtype_imm" in expr:
        _dtype(expr["dtype_imm"], f"{where}.dtype_imm")
    else:
        raise GraphFormatError(f"{where} is no known expression (keys {sorted(expr)[:6]})")


def _check_paged_kv(expr: dict, defined: set[str], where: str, depth: int) -> None:
    """A paged-KV attention call (model/paged_kv.py): one or three tensor inputs, a config of numbers,
    three tensor outputs."""
    args = _list(expr["paged_kv"], f"{where}.paged_kv")
    if len(args) not in (1, 3):
        raise GraphFormatError(f"{where}: a paged-KV call takes qkv and optionally the keys and values before it")
    for k, arg in enumerate(args):
        _check_expr(arg, defined, f"{where}.paged_kv[{k}]", depth + 1)
    try:
        check_config(_dict(expr.get("config"), f"{where}.config"))
    except ValueError as exc:
        raise GraphFormatError(f"{where}.config: {exc}") from None
    types = _list(expr.get("ty_args"), f"{where}.ty_args")
    if len(types) != 3:
        raise GraphFormatError(f"{where}: a paged-KV call returns out, keys and values")
    for k, ty in enumerate(types):
        if "tuple" in _dict(ty, f"{where}.ty_args[{k}]"):
            raise GraphFormatError(f"{where}.ty_args[{k}]: a paged-KV call's outputs are tensors")
        _check_type(ty, f"{where}.ty_args[{k}]", depth + 1)


def _check_type(ty, where: str, depth: int) -> None:
    if depth > MAX_GRAPH_DEPTH:
        raise GraphFormatError(f"{where}: types nested deeper than {MAX_GRAPH_DEPTH}")
    _dict(ty, where)
    if "tuple" in ty:
        for k, field in enumerate(_list(ty["tuple"], f"{where}.tuple")):
            _check_type(field, f"{where}.tuple[{k}]", depth + 1)
        return
    _shape(ty.get("shape"), f"{where}.shape")
    _dtype(ty.get("dtype"), f"{where}.dtype")


def _check_value(value, where: str, depth: int) -> None:
    if depth > MAX_GRAPH_DEPTH:
        raise GraphFormatError(f"{where}: values nested deeper than {MAX_GRAPH_DEPTH}")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        _int_in(value, where, -2**63, 2**63 - 1)
        return
    if isinstance(value, float):
        return
    _dict(value, where)
    if "list" in value:
        for k, item in enumerate(_list(value["list"], f"{where}.list")):
            _check_value(item, f"{where}[{k}]", depth + 1)
    elif "int" in value:
        _int_in(value["int"], f"{where}.int", -2**63, 2**63 - 1)
        _dtype(value.get("dtype"), f"{where}.dtype")
    elif "float" in value:
        if not isinstance(value["float"], (int, float)) or isinstance(value["float"], bool):
            raise GraphFormatError(f"{where}.float must be a number")
        _dtype(value.get("dtype"), f"{where}.dtype")
    elif "dtype" in value:
        _dtype(value["dtype"], f"{where}.dtype")
    elif "map" in value:
        for name, item in _dict(value["map"], f"{where}.map").items():
            _check_value(item, f"{where}.map.{name[:40]}", depth + 1)
    else:
        raise GraphFormatError(f"{where} is no known attribute value (keys {sorted(value)[:6]})")


def _check_const(const, where: str) -> None:
    _dict(const, where)
    dtype = _dtype(const.get("dtype"), f"{where}.dtype")
    shape = _shape(const.get("shape"), f"{where}.shape")
    data = _str(const.get("data"), f"{where}.data")
    itemsize = _const_dtype(dtype, where).itemsize
    nbytes = math.prod(shape) * itemsize
    if len(data) != 4 * math.ceil(nbytes / 3):
        raise GraphFormatError(f"{where} holds {len(data)} base64 characters for {nbytes} bytes")


def _const_dtype(dtype: str, where: str) -> np.dtype:
    if dtype == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype("bool" if dtype == "bool" else dtype)
    except TypeError:
        raise GraphFormatError(f"{where} has dtype {dtype!r}, which a constant cannot have") from None


def _dict(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise GraphFormatError(f"{where} must be an object, not {_kind(value)}")
    return value


def _list(value, where: str) -> list:
    if not isinstance(value, list):
        raise GraphFormatError(f"{where} must be a list, not {_kind(value)}")
    return value


def _str(value, where: str) -> str:
    if not isinstance(value, str):
        raise GraphFormatError(f"{where} must be a string, not {_kind(value)}")
    return value


def _name(value, where: str) -> str:
    name = _str(value, where)
    if not name or len(name) > 256:
        raise GraphFormatError(f"{where} must be a name of 1 to 256 characters")
    return name


def _int_in(value, where: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise GraphFormatError(f"{where} must be an integer, not {_kind(value)}")
    if not low <= value <= high:
        raise GraphFormatError(f"{where} is {value}, outside {low}..{high}")
    return value


def _shape(value, where: str, allow_negative: bool = False) -> list[int]:
    dims = _list(value, where)
    if len(dims) > MAX_RANK:
        raise GraphFormatError(f"{where} has {len(dims)} dimensions (at most {MAX_RANK})")
    low = -MAX_DIM if allow_negative else 0
    return [_int_in(dim, f"{where}[{k}]", low, MAX_DIM) for k, dim in enumerate(dims)]


def _dtype(value, where: str) -> str:
    dtype = _str(value, where)
    if not _DTYPE.fullmatch(dtype):
        raise GraphFormatError(f"{where} is {dtype[:40]!r}, not a dtype")
    return dtype


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def type_to_json(ty) -> dict:
    """A tensor's (or a tuple's) type as this format writes a parameter's."""
    return _type_to_json(ty)


def _type_to_json(ty) -> dict:
    from tvm import relax

    if isinstance(ty, relax.TensorType):
        return {"shape": [int(d) for d in ty.shape.values], "dtype": str(ty.dtype)}
    if isinstance(ty, relax.TupleType):
        return {"tuple": [_type_to_json(f) for f in ty.fields]}
    raise ValueError(f"cannot serialize type {ty}")


def _type_from_json(data: dict):
    from tvm import relax

    if "tuple" in data:
        return relax.TupleType([_type_from_json(f) for f in data["tuple"]])
    return relax.TensorType([int(d) for d in data["shape"]], str(data["dtype"]))


def _expr_to_json(expr) -> dict:
    from tvm import relax

    if isinstance(expr, relax.Var):
        return {"var": expr.name}
    if isinstance(expr, relax.Call) and is_host_only_call(expr):  # its own kind: no function name stored
        return {"host_only": [_expr_to_json(a) for a in expr.args[1].fields],
                "ty_args": [_type_to_json(t) for t in expr.ty_args]}
    if isinstance(expr, relax.Call) and is_paged_kv_call(expr):  # its own kind: the config is data
        tensors, config, out_types = call_parts(expr)
        return {"paged_kv": [_expr_to_json(a) for a in tensors], "config": dict(sorted(config.items())),
                "ty_args": [_type_to_json(t) for t in out_types]}
    if isinstance(expr, relax.Call):
        if not hasattr(expr.op, "name") or isinstance(expr.op, relax.GlobalVar):
            raise ValueError(f"cannot serialize a call to {expr.op}")
        return {"call": expr.op.name, "args": [_expr_to_json(a) for a in expr.args],
                "attrs": _attrs_to_json(expr.attrs),
                "ty_args": [_type_to_json(t) for t in (expr.ty_args or [])]}
    if isinstance(expr, relax.Tuple):
        return {"tuple": [_expr_to_json(f) for f in expr.fields]}
    if isinstance(expr, relax.TupleGetItem):
        return {"get_item": _expr_to_json(expr.tuple_value), "index": int(expr.index)}
    if isinstance(expr, relax.ShapeExpr):
        return {"shape": [int(v) for v in expr.values]}
    key = type(expr).__tvm_ffi_type_info__.type_key
    if key == "ir.GenericConst":
        array = expr.value.numpy()
        return {"const": {"dtype": str(expr.value.dtype), "shape": list(array.shape),
                          "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}}
    if key.endswith("IntImm") or key.endswith("FloatImm"):
        return {"imm": _value_to_json(expr)}
    if key.endswith("StringImm"):
        return {"str": str(expr.value)}
    if key.endswith("DataTypeImm"):
        return {"dtype_imm": str(expr.value)}
    raise ValueError(f"cannot serialize {key}: {expr}")


def _expr_from_json(data: dict, env: dict):
    from tvm import relax
    import tvm

    if "var" in data:
        return env[data["var"]]
    if "call" in data:
        attrs = _attrs_from_json(data.get("attrs"))
        args = [_expr_from_json(a, env) for a in data["args"]]
        ty_args = [_type_from_json(t) for t in data.get("ty_args", [])]
        return relax.Call(tvm.ir.Op.get(data["call"]), args, attrs, ty_args)  # `_check_ops_exist` vouched
    if "host_only" in data:  # model/host_only.py: the placeholder's function is our constant
        return placeholder([_expr_from_json(a, env) for a in data["host_only"]],
                           [_type_from_json(t) for t in data["ty_args"]])
    if "paged_kv" in data:  # model/paged_kv.py: the packed function is our constant
        return paged_kv_call([_expr_from_json(a, env) for a in data["paged_kv"]], data["config"],
                             [_type_from_json(t) for t in data["ty_args"]])
    if "tuple" in data:
        return relax.Tuple([_expr_from_json(f, env) for f in data["tuple"]])
    if "get_item" in data:
        return relax.TupleGetItem(_expr_from_json(data["get_item"], env), int(data["index"]))
    if "shape" in data:
        return relax.ShapeExpr([int(v) for v in data["shape"]])
    if "const" in data:
        return relax.const(_array_from_json(data["const"]), data["const"]["dtype"])
    if "imm" in data:
        return _value_from_json(data["imm"])
    if "str" in data:
        return tvm.ir.make_node("ir.StringImm", value=data["str"])
    if "dtype_imm" in data:
        return tvm.ir.make_node("ir.DataTypeImm", value=tvm.DataType(data["dtype_imm"]))
    raise TraceError(f"unknown graph expression {sorted(data)}; the trace is corrupt")


def _array_from_json(data: dict) -> np.ndarray:
    dtype = data["dtype"]
    if dtype == "bfloat16":
        import ml_dtypes
        np_dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        np_dtype = np.dtype("bool" if dtype == "bool" else dtype)
    raw = base64.b64decode(data["data"], validate=True)
    return np.frombuffer(raw, dtype=np_dtype).reshape(data["shape"]).copy()


def _attrs_to_json(attrs):
    if attrs is None:
        return None
    info = type(attrs).__tvm_ffi_type_info__
    fields = {}
    while info is not None:
        for field in info.fields:
            fields[field.name] = _value_to_json(getattr(attrs, field.name))
        info = info.parent_type_info
    return {"type": type(attrs).__tvm_ffi_type_info__.type_key, "fields": fields}


def _attrs_from_json(data):
    import tvm

    if data is None:
        return None
    if not str(data.get("type", "")).startswith(ALLOWED_ATTRS_PREFIX):
        raise TraceError(f"the trace's graph names attribute type {data.get('type')!r}, which is not a "
                         "Relax op attribute; the trace is corrupt or crafted")
    fields = {name: _value_from_json(value) for name, value in data["fields"].items()}
    return tvm.ir.make_node(data["type"], **fields)


def _value_to_json(value):
    import tvm

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return {"list": [_value_to_json(v) for v in value]}
    if isinstance(value, tvm.DataType) or type(value).__name__ in ("DataType", "dtype"):
        return {"dtype": str(value)}
    key = type(value).__tvm_ffi_type_info__.type_key if hasattr(type(value), "__tvm_ffi_type_info__") else ""
    if key.endswith("IntImm"):
        return {"int": int(value.value), "dtype": str(value.ty)}
    if key.endswith("FloatImm"):
        return {"float": float(value.value), "dtype": str(value.ty)}
    if key.endswith("String") or isinstance(value, str):
        return str(value)
    if type(value).__name__ == "Map" or hasattr(value, "items"):
        return {"map": {str(k): _value_to_json(v) for k, v in value.items()}}
    raise ValueError(f"cannot serialize attribute value {value!r} ({key or type(value).__name__})")


def _value_from_json(data):
    import tvm

    if not isinstance(data, dict):
        return data
    if "list" in data:
        return [_value_from_json(v) for v in data["list"]]
    if "int" in data:
        return tvm.tirx.IntImm(data["dtype"], data["int"])
    if "float" in data:
        return tvm.tirx.FloatImm(data["dtype"], data["float"])
    if "dtype" in data:
        return tvm.DataType(data["dtype"])
    if "map" in data:
        return {k: _value_from_json(v) for k, v in data["map"].items()}
    raise TraceError(f"unknown attribute value {sorted(data)}; the trace is corrupt")
