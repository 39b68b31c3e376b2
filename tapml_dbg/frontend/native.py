"""TVM-native models: a user's own Relax IRModule (e.g. from `relax.frontend.nn`'s `export_tvm`) as
the graph the tool works on, with no PyTorch graph behind it.

A model file's `build_tvm()` returns `(mod, args)`: `mod` a Relax IRModule, `args` the numpy arrays
its entry function takes, parameters included, in the function's order (`export_tvm`'s). `args` may
also be `(name, array)` pairs, as `export_tvm` names its parameters (`blocks.0.up.weight`): those
names give each op its layer (the `nn.Module` path of the parameters it reads, else of its inputs).

The ops are the entry function's bindings, named as in the module; the entry function becomes the
graph's `main`. Everything about the module is checked here, so that a bad file fails with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tapml_dbg.errors import ModelError, UsageError
from tapml_dbg.frontend.importer import flatten_ty, ordered_free_vars, output_names, relax_op_name
from tapml_dbg.frontend.model_loader import load_python_function, split_model_spec
from tapml_dbg.model.graph import Graph, OpInfo

NATIVE_FUNC = "build_tvm"  # the function a model file defines for a TVM-native model
ENTRY_NAMES = ("main", "forward")  # the entry function looked for, in order, when none is named


@dataclass
class NativeModel:
    """A TVM-native model as the recorder needs it: the graph, the entry's arguments by name."""

    graph: Graph
    inputs: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    entry: str  # the module's own name of the entry function


def defines_native(spec: str) -> bool:
    """The model file defines `build_tvm` and no FUNC was named: `--source tvm:T` records it natively."""
    path, func = split_model_spec(spec)
    if ":" in spec.rpartition(".py")[2] or func != "build":
        return func.startswith(NATIVE_FUNC)  # build_tvm, or a variant of it (build_tvm_fp16)
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return f"def {NATIVE_FUNC}(" in text


def native_spec(spec: str) -> str:
    """`FILE.py` -> `FILE.py:build_tvm`; a spec that names its function stays as it is."""
    path, func = split_model_spec(spec)
    return spec if func != "build" or spec.endswith(":build") else f"{path}:{NATIVE_FUNC}"


def load_native(spec: str, entry: str | None = None) -> NativeModel:
    """Call the file's `build_tvm()` (FILE.py alone means FILE.py:build_tvm) and turn its module into the
    graph: one line per mistake."""
    spec = native_spec(spec)
    build = load_python_function(spec)
    try:
        result = build()
    except Exception as exc:
        raise ModelError(f"{spec}: {NATIVE_FUNC} raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelError(f"{spec}: {NATIVE_FUNC} must return (tvm.IRModule, list_of_numpy_arrays), "
                         f"got {type(result).__name__}")
    mod, args = result
    return native_model(mod, args, entry, spec)


def native_model(mod, args, entry: str | None = None, where: str = "build_tvm()") -> NativeModel:
    """The graph of `mod`'s entry function fed `args` (checked against its parameters)."""
    import tvm
    from tvm import relax

    if not isinstance(mod, tvm.IRModule):
        raise ModelError(f"{where}: the first returned value must be a tvm.IRModule (a Relax module), "
                         f"got {type(mod).__name__}")
    name, func = _entry_function(mod, entry, where)
    names, arrays = _arguments(args, where)
    if len(arrays) != len(func.params):
        raise ModelError(f"{where}: the entry function {name} takes {len(func.params)} arguments "
                         f"(inputs and parameters) but {len(arrays)} arrays were given")
    for param, array in zip(func.params, arrays):
        _check_argument(param, array, where)
    func = relax.transform.ToNonDataflow()(tvm.IRModule({name: func}))[name]
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
    main = relax.Function(func.params, func.body, func.ret_ty, func.is_pure).with_attrs(
        {"global_symbol": "main", "num_input": num_input})
    graph_mod = tvm.IRModule({"main": main})
    graph = _graph(graph_mod, names, num_input)
    inputs = {p.name: a for p, a in zip(main.params[:num_input], arrays[:num_input])}
    params = {p.name: a for p, a in zip(main.params[num_input:], arrays[num_input:])}
    return NativeModel(graph, inputs, params, name)


def _entry_function(mod, entry: str | None, where: str):
    from tvm import relax

    functions = {gv.name_hint: func for gv, func in mod.functions_items() if isinstance(func, relax.Function)}
    if not functions:
        raise ModelError(f"{where}: the module holds no Relax function (give a Relax IRModule, e.g. from "
                         "nn.Module.export_tvm)")
    if entry is not None:
        if entry not in functions:
            raise UsageError(f"{where}: the module has no Relax function {entry!r} "
                             f"(it has: {', '.join(sorted(functions))})")
        return entry, functions[entry]
    public = [name for name, func in functions.items() if not name.startswith("_")]
    for name in ENTRY_NAMES:
        if name in functions:
            return name, functions[name]
    if len(public) == 1:
        return public[0], functions[public[0]]
    raise UsageError(f"{where}: the module has several Relax functions ({', '.join(sorted(functions))}) and no "
                     "main or forward: name the entry function with --entry NAME")


def _arguments(args, where: str) -> tuple[list[str | None], list[np.ndarray]]:
    """The arrays of `args`, and their names where pairs gave them (export_tvm's dotted names)."""
    if isinstance(args, np.ndarray) or not isinstance(args, (list, tuple)):
        raise ModelError(f"{where}: the second returned value must be a list of numpy arrays (the entry "
                         f"function's arguments, parameters included), got {type(args).__name__}")
    names, arrays = [], []
    for position, item in enumerate(args):
        name = None
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            name, item = item
        if hasattr(item, "numpy") and not isinstance(item, np.ndarray):
            item = item.numpy()  # a tvm.runtime.Tensor or a torch tensor
        if not isinstance(item, np.ndarray):
            raise ModelError(f"{where}: argument {position} is a {type(item).__name__}, not a numpy array")
        names.append(name)
        arrays.append(np.ascontiguousarray(item))
    return names, arrays


def _check_argument(param, array: np.ndarray, where: str) -> None:
    specs = flatten_ty(param.ty)
    if not specs or len(specs) != 1:
        raise ModelError(f"{where}: entry parameter {param.name} is not one static tensor (tapml-dbg records "
                         "tensor arguments of static shapes only)")
    spec = specs[0]
    if tuple(array.shape) != tuple(spec.shape) or _dtype_name(array.dtype) != spec.dtype:
        raise ModelError(f"{where}: argument {param.name} is {_dtype_name(array.dtype)}{list(array.shape)} but the "
                         f"entry function takes {spec.dtype}{list(spec.shape)}: give arrays of those shapes and dtypes")


def _dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if str(dtype) == "bfloat16" else ("bool" if dtype == np.bool_ else str(dtype))


def _graph(mod, arg_names: list[str | None], num_input: int) -> Graph:
    """The op table of `mod["main"]`: one op per binding, its layer from the parameters' module paths."""
    from tvm import relax

    main = mod["main"]
    inputs = [(p.name, flatten_ty(p.ty)[0]) for p in main.params[:num_input]]
    params = [(p.name, flatten_ty(p.ty)[0]) for p in main.params[num_input:]]
    module_of = {p.name: module_path(name) for p, name in zip(main.params, arg_names) if name}
    layers: dict[str, str] = {}
    ops = []
    for index, binding in enumerate(b for block in main.body.blocks for b in block.bindings):
        reads = ordered_free_vars(binding.value)
        layer = op_layer(reads, module_of, layers)
        layers[binding.var.name] = layer
        name = relax_op_name(binding.value)
        ops.append(OpInfo(index=index, name=binding.var.name, op=name, relax_op=name, layer=layer,
                          inputs=reads, outputs=flatten_ty(binding.var.ty) or [],
                          is_tuple=isinstance(binding.var.ty, relax.TupleType)))
    names = [op.name for op in ops]
    if len(set(names)) != len(names):
        raise ModelError("the entry function binds two variables of one name: give them distinct names "
                         "(tapml-dbg names its ops by them)")
    return Graph(mod=mod, ops=ops, inputs=inputs, params=params, outputs=output_names(main))


def module_path(param_name: str) -> str:
    """`blocks.0.up.weight` -> `blocks.0.up`: the module that owns a parameter."""
    return param_name.rpartition(".")[0]


def op_layer(reads: list[str], module_of: dict[str, str], layers: dict[str, str]) -> str:
    """The module of the parameters an op reads, else the layer of the latest op it reads (a weight's
    transpose and the matmul that reads it share the weight's module)."""
    owned = [module_of[name] for name in reads if module_of.get(name)]
    if owned:
        return common_path(owned)
    order = {name: position for position, name in enumerate(layers)}
    upstream = sorted((name for name in reads if name in layers), key=order.__getitem__)
    return layers[upstream[-1]] if upstream else ""


def common_path(paths: list[str]) -> str:
    parts = [path.split(".") for path in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)
