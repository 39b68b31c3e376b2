"""Data-only serialization of a Relax `main` to JSON, and back.

TVM 0.27's `tvm.ir.save_json` segfaults in this wheel, and TVMScript is code (parsing it
evaluates Python), so a trace stores the graph in this small format instead: bindings of
op calls, attrs as plain fields, constants as base64 bytes. Loading it only calls TVM
constructors; nothing from the file is executed.
"""

from __future__ import annotations

import base64

import numpy as np

from tapml_dbg.errors import TraceError

SCHEMA = "tapml-relax-graph/1"
ALLOWED_ATTRS_PREFIX = "relax.attrs."  # a trace may only rebuild op attributes, no other TVM object


def function_to_json(func) -> dict:
    """Serialize a Relax function made of one binding block (what the importer produces)."""
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
    params = [{"name": p.name, **_type_to_json(p.ty)} for p in func.params]
    bindings = []
    for block in func.body.blocks:
        for binding in block.bindings:
            bindings.append({"name": binding.var.name, "value": _expr_to_json(binding.value)})
    return {"schema": SCHEMA, "num_input": num_input, "params": params, "bindings": bindings,
            "output": _expr_to_json(func.body.body)}


def function_from_json(data: dict):
    """Rebuild the function with a BlockBuilder, which re-infers every binding's type."""
    from tvm import relax

    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise TraceError(f"the trace's graph is not in format {SCHEMA}; record the model again")
    try:
        env: dict[str, object] = {}
        params = [relax.Var(p["name"], _type_from_json(p)) for p in data["params"]]
        env.update({p.name: p for p in params})
        builder = relax.BlockBuilder()
        with builder.function("main", params, attrs={"num_input": int(data["num_input"])}, pure=True):
            for binding in data["bindings"]:
                env[binding["name"]] = builder.emit(_expr_from_json(binding["value"], env), binding["name"])
            builder.emit_func_output(_expr_from_json(data["output"], env))
        return builder.get()["main"]
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(f"the trace's graph cannot be rebuilt ({type(exc).__name__}: {exc}); "
                         "it was written by an incompatible TVM or is corrupt") from exc


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
        attrs = _attrs_from_json(data["attrs"])
        args = [_expr_from_json(a, env) for a in data["args"]]
        ty_args = [_type_from_json(t) for t in data.get("ty_args", [])]
        return relax.Call(tvm.ir.Op.get(data["call"]), args, attrs, ty_args)
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
    raw = base64.b64decode(data["data"])
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
