"""A TVM-native LLM (`build_tvm()` returning the dict of docs/native-llm.md) unrolled into one graph.

MLC-LLM's way of deploying an LLM is a Relax module with `prefill` and `decode` functions that take
the input ids, TVM's paged KV cache object and the weights. `record --source tvm:T --generate N`
records a prefill and N greedy decode steps of it as ONE graph, as frontend/generation.py does for
a transformers model, so that every command works on it unchanged:

    main(ids (1, L), tokens (1, N), *weights) -> (logits (1, N + 1, vocab), keys and values of every layer)

- step 0 is `prefill`'s bindings with its symbolic length bound to the prompt's; step k (1..N) is
  `decode`'s, fed `tokens[:, k - 1]` (the source's greedy token: teacher forcing, as for PyTorch);
  each binding keeps its name with the step appended (`matmul15_step2`);
- each call of the cache's `attention_with_fused_qkv` becomes model/paged_kv.py's call with the
  cache state as values: it reads the keys and values the same layer's call of the step before it
  returned and returns its own; the `get_item`s after it name the attention output (`_out`) and
  the layer's cache after the step (`_keys`, `_values`);
- every step's logits at its last position are one op (`logits_step2`), concatenated into `logits`.

Each op's layer comes from the weights it reads (their transformers names give the module path,
`model.layers.0.self_attn`), else from the op before it, as for a one-function native model.
Everything about the module is checked here, so that a bad file fails with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tapml_dbg.errors import ModelError
from tapml_dbg.frontend.importer import flatten_ty, ordered_free_vars, output_names, relax_op_name
from tapml_dbg.frontend.native import NativeModel, common_path, module_path
from tapml_dbg.model.generation import PREFILL_STEP, TOKENS_INPUT, step_kind
from tapml_dbg.model.graph import Graph, OpInfo
from tapml_dbg.model.paged_kv import PAGED_KV_OP, is_paged_kv_call, paged_kv_call
from tapml_dbg.portable.paged_kv import BUILTIN
from tapml_dbg.portable.runner import parse_target

REQUIRED_KEYS = ("mod", "params", "prompt", "functions", "cache", "kv")
REQUIRED_FUNCTIONS = ("create_cache", "prefill", "decode")
ENTRY = "prefill+decode"  # a generation's entry, as the trace's meta `native.entry` names it
IDS_INPUT = "ids"
LOGITS_OUTPUT = "logits"


@dataclass
class NativeLLM:
    """`build_tvm()`'s dict, checked: what the deployment loop and the unrolled graph need."""

    mod: object  # tvm.IRModule
    params: list[tuple[str, np.ndarray]]
    prompt: np.ndarray  # int32 (1, L)
    functions: dict[str, str]
    cache: dict[str, int]  # create_cache's arguments, in order
    kv: dict  # num_layers, num_kv_heads, head_dim, dtype, rope_theta[, rope_scale, rotary_dim]
    target: str = ""
    model_class: str = "relax.frontend.nn"


def native_llm(result, where: str = "build_tvm()") -> NativeLLM:
    """Check `build_tvm()`'s dict: one line per mistake, saying what to return."""
    import tvm
    from tvm import relax

    missing = [key for key in REQUIRED_KEYS if key not in result]
    if missing:
        raise ModelError(f"{where}: the native LLM's dict lacks {', '.join(missing)} (docs/native-llm.md "
                         "lists what build_tvm() returns)")
    mod = result["mod"]
    if not isinstance(mod, tvm.IRModule):
        raise ModelError(f"{where}: 'mod' must be a tvm.IRModule, got {type(mod).__name__}")
    functions = dict(result["functions"])
    for role in REQUIRED_FUNCTIONS:
        name = functions.get(role)
        if not name or name not in {gv.name_hint for gv in mod.get_global_vars()}:
            raise ModelError(f"{where}: the module has no {role} function {name!r} (functions[{role!r}] must name "
                             f"a function of the module, e.g. MLC-LLM's {role})")
        if role != "create_cache" and not isinstance(mod[name], relax.Function):
            raise ModelError(f"{where}: {name} is not a Relax function")
    prompt = np.asarray(result["prompt"])
    if prompt.ndim != 2 or prompt.shape[0] != 1 or prompt.dtype.kind not in "iu":
        raise ModelError(f"{where}: 'prompt' must be integer ids of shape (1, L), got {prompt.dtype}{list(prompt.shape)}")
    kv = dict(result["kv"])
    for key in ("num_layers", "num_kv_heads", "head_dim", "dtype", "rope_theta"):
        if key not in kv:
            raise ModelError(f"{where}: 'kv' lacks {key!r} (the cache's layout and rotary, docs/native-llm.md)")
    cache = dict(result["cache"])
    _check_cache(cache, where)
    params = [(str(name), np.ascontiguousarray(value)) for name, value in result["params"]]
    return NativeLLM(mod, params, prompt.astype("int32"), functions, cache, kv,
                     str(result.get("target", "")), str(result.get("model_class", "relax.frontend.nn")))


PAGE_SIZE = 16  # TVM 0.27's TIR paged-attention kernels index pages of 16 positions (other sizes read wrong)


def _check_cache(cache: dict, where: str) -> None:
    """create_cache's arguments: whole numbers, positive but the sliding-window switch, pages of 16."""
    for name, value in cache.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                (value < 1 and name != "support_sliding_window") or value < 0:
            raise ModelError(f"{where}: cache[{name!r}] is {value!r}: create_cache's arguments are positive whole "
                             "numbers (support_sliding_window 0 or 1)")
    if cache.get("page_size", PAGE_SIZE) != PAGE_SIZE:
        raise ModelError(f"{where}: cache['page_size'] is {cache['page_size']}: TVM's TIR paged-attention kernels "
                         f"work on pages of {PAGE_SIZE} positions; use page_size {PAGE_SIZE}")


def check_target(native: NativeLLM, target: str, where: str) -> None:
    """The cache's kernels were generated for one target kind (CPU or GPU code): record on that kind."""
    if native.target and parse_target(native.target).kind.name != parse_target(target).kind.name:
        raise ModelError(f"{where}: build_tvm() generated its paged-KV kernels for {native.target}, not {target}: "
                         f"record with --source tvm:{native.target}, or have build_tvm(target) use the target it is "
                         "given")


def unroll(native: NativeLLM, tokens: list[int]) -> NativeModel:
    """The graph of a prefill over the prompt and len(tokens) decode steps fed `tokens`, as a native model
    whose entry is `ENTRY`."""
    import tvm
    from tvm import relax

    prefill, decode = (_function(native, role) for role in ("prefill", "decode"))
    weights = prefill.params[2:]
    if len(decode.params) != len(prefill.params) or len(weights) != len(native.params):
        raise ModelError(f"prefill and decode must take (ids, cache, *weights) with the {len(native.params)} "
                         "weights of 'params', in its order")
    prompt_len = native.prompt.shape[1]
    prefill = _bound_length(prefill, prompt_len)
    ids = relax.Var(IDS_INPUT, relax.TensorType((1, prompt_len), "int32"))
    fed = relax.Var(TOKENS_INPUT, relax.TensorType((1, len(tokens)), "int32"))
    main_weights = [relax.Var(param.name, param.ty) for param in weights]
    builder = relax.BlockBuilder()
    steps: list[int] = []
    with builder.function("main", [ids, fed, *main_weights], {"num_input": 2}):
        state: dict[int, tuple] = {}
        logits = []
        for step in range(len(tokens) + 1):
            if step == PREFILL_STEP:
                step_ids, func = ids, prefill
            else:
                step_ids = _emit(builder, steps, step, relax.op.strided_slice(fed, [1], [step - 1], [step]),
                                 f"tokens_step{step}")
                func = decode
            env = {func.params[0]: step_ids, **dict(zip(func.params[2:], main_weights))}
            result = _step(builder, steps, step, func, env, state, native)
            logits.append(_last_position(builder, steps, step, result))
        out = _emit(builder, steps, len(tokens), relax.op.concat(logits, axis=1), LOGITS_OUTPUT)
        picked = [var.name for var in (*logits, out)]
        finals = [value for layer in sorted(state) for value in state[layer]]
        builder.emit_func_output(relax.Tuple([out, *finals]))
    main = builder.get()["main"]
    mod = tvm.IRModule({"main": main})
    names = [IDS_INPUT, TOKENS_INPUT] + [name for name, _ in native.params]
    graph = _graph(mod, names, steps, set(picked))
    inputs = {IDS_INPUT: native.prompt, TOKENS_INPUT: np.asarray([tokens], dtype="int32")}
    params = {var.name: value for var, (_, value) in zip(main_weights, native.params)}
    return NativeModel(graph, inputs, params, ENTRY)


def _function(native: NativeLLM, role: str):
    import tvm
    from tvm import relax

    func = native.mod[native.functions[role]]
    func = relax.transform.ToNonDataflow()(tvm.IRModule({"f": func}))["f"]
    if len(func.params) < 2:
        raise ModelError(f"{native.functions[role]} must take (ids, cache, *weights)")
    return func


def _bound_length(func, length: int):
    """prefill with its symbolic sequence length bound to the prompt's."""
    from tvm import tirx

    shape = func.params[0].ty.shape
    symbolic = [dim for dim in getattr(shape, "values", []) if isinstance(dim, tirx.Var)]
    return func.bind_symbolic_vars({symbolic[0]: length}) if symbolic else func


def _emit(builder, steps: list[int], step: int, value, name: str):
    steps.append(step)
    return builder.emit(value, name)


def _step(builder, steps, step: int, func, env: dict, state: dict, native: NativeLLM):
    """Emit one step's bindings; returns the step's logits (the function's first result)."""
    from tvm import relax

    cache_param = func.params[1]
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Tuple) and _reads(value, cache_param):  # the returned (logits, cache)
                env[binding.var] = relax.Tuple([_substitute(item, env) for item in value.fields
                                                if not (isinstance(item, relax.Var) and item.same_as(cache_param))])
                continue
            if _reads(value, cache_param):
                env[binding.var] = _attention(builder, steps, step, binding, env, state, native)
                continue
            env[binding.var] = _emit(builder, steps, step, _substitute(value, env), f"{binding.var.name}_step{step}")
    result = _substitute(func.body.body, env)
    if not isinstance(result, relax.Tuple):
        raise ModelError("prefill/decode must return (logits, cache), as MLC-LLM's do")
    return result.fields[0]


def _attention(builder, steps, step: int, binding, env: dict, state: dict, native: NativeLLM):
    """The cache's attention call as a paged-KV call on explicit state; returns its attention output."""
    from tvm import relax

    value = binding.value
    if not (getattr(value.op, "name", "") == "relax.call_dps_packed"
            and str(value.args[0].global_symbol) == BUILTIN):
        raise ModelError(f"{binding.var.name} uses the KV cache through {relax_op_name(value)}: tapml-dbg records the "
                         f"cache's {BUILTIN.rpartition('.')[2]} calls only")
    _, layer, scale, qkv = value.args[1].fields
    qkv = _substitute(qkv, env)
    out_type = value.ty_args[0]
    n_new, heads, head_dim = (int(d) for d in out_type.shape)
    kv_heads = (int(qkv.ty.shape[-2]) - heads) // 2
    layer = int(layer.value)
    before = state.get(layer)
    n_total = n_new + (int(before[0].ty.shape[0]) if before else 0)
    config = {"layer": layer, "num_qo_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
              "sm_scale": float(scale.value), "rope_theta": float(native.kv["rope_theta"]),
              "rope_scale": native.kv.get("rope_scale", 1), "rotary_dim": int(native.kv.get("rotary_dim", head_dim)),
              "page_size": int(native.cache.get("page_size", PAGE_SIZE)), "dtype": str(out_type.dtype)}
    state_type = relax.TensorType((n_total, kv_heads, head_dim), out_type.dtype)
    name = f"{binding.var.name}_step{step}"
    call = _emit(builder, steps, step, paged_kv_call([qkv, *(before or ())], config, [out_type, state_type, state_type]),
                 name)
    out, keys, values = (_emit(builder, steps, step, relax.TupleGetItem(call, k), f"{name}_{part}")
                         for k, part in enumerate(("out", "keys", "values")))
    state[layer] = (keys, values)
    return out


def _reads(value, var) -> bool:
    return any(name == var.name for name in ordered_free_vars(value))


def _substitute(expr, env: dict):
    """`expr` with its variables replaced as `env` maps them (bindings' values are shallow)."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        return env.get(expr, expr)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [_substitute(arg, env) for arg in expr.args], expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substitute(item, env) for item in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_substitute(expr.tuple_value, env), expr.index)
    return expr


def _last_position(builder, steps, step: int, logits):
    """The step's logits at its last position, (1, 1, vocab)."""
    from tvm import relax

    length = int(logits.ty.shape[1])
    return _emit(builder, steps, step, relax.op.strided_slice(logits, [1], [length - 1], [length]),
                 f"logits_step{step}")


def _graph(mod, arg_names: list[str], steps: list[int], picked: set[str]) -> Graph:
    """The op table of the unrolled `main`: one op per binding, with its step and layer."""
    from tvm import relax

    main = mod["main"]
    inputs = [(p.name, flatten_ty(p.ty)[0]) for p in main.params[:2]]
    params = [(p.name, flatten_ty(p.ty)[0]) for p in main.params[2:]]
    module_of = {p.name: module_path(name) for p, name in zip(main.params, arg_names) if "." in name}
    bindings = [b for block in main.body.blocks for b in block.bindings]
    layers = _layers(bindings, module_of, picked)
    ops = []
    for index, (binding, step) in enumerate(zip(bindings, steps)):
        name = PAGED_KV_OP if is_paged_kv_call(binding.value) else relax_op_name(binding.value)
        ops.append(OpInfo(index=index, name=binding.var.name, op=name, relax_op=name, layer=layers[index],
                          inputs=ordered_free_vars(binding.value), outputs=flatten_ty(binding.var.ty) or [],
                          is_tuple=isinstance(binding.var.ty, relax.TupleType), step=step))
    if len({op.name for op in ops}) != len(ops):
        raise ModelError("prefill/decode bind two variables of one name: give them distinct names")
    return Graph(mod=mod, ops=ops, inputs=inputs, params=params, outputs=output_names(main))


LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims", "get_item")


def _layers(bindings, module_of: dict[str, str], picked: set[str]) -> list[str]:
    """Each op's layer, as transformers' module paths would place it (so that `diff` meets a transformers
    recording of the model at its layers' boundaries):
    - an op that reads weights (or values computed from weights alone: a weight's transpose) belongs to
      their module (`model.layers.0.self_attn.q_proj`);
    - a layout op (reshape, transpose, get_item) to the layer of the latest op it reads (an Embedding's
      reshape after its take);
    - any other op to the module that calls it: the deeper of the modules common to everything it reads
      (out of a module that owns weights: those compute one op) and common to the latest op it reads and
      the next op that reads weights (`silu` between gate_proj and up_proj: `mlp`; a residual add between
      o_proj and post_attention_layernorm: the decoder layer);
    - the logits picked per step and gathered: the model's own (`""`)."""
    derived = dict(module_of)  # value -> the module of the weights it is computed from alone
    owners = set(module_of.values())
    weighted: list[str | None] = []
    for binding in bindings:
        reads = ordered_free_vars(binding.value)
        from_weights = [derived[name] for name in reads if name in derived]
        if reads and len(from_weights) == len(reads):
            derived[binding.var.name] = common_path(from_weights)
        weighted.append(common_path(from_weights) if from_weights else None)
    following: list[str | None] = [None] * len(bindings)
    upcoming = None
    for index in range(len(bindings) - 1, -1, -1):
        following[index] = upcoming
        upcoming = weighted[index] if weighted[index] is not None else upcoming
    layers: dict[str, str] = {}
    order: dict[str, int] = {}  # each op's position: the latest op a binding reads
    for index, binding in enumerate(bindings):
        reads = [name for name in ordered_free_vars(binding.value) if name in layers]
        op = relax_op_name(binding.value)
        if binding.var.name in picked:
            layer = ""
        elif weighted[index] is not None:
            layer = weighted[index]
        elif not reads:
            layer = ""
        elif op in LAYOUT_OPS and len(reads) == 1:
            layer = layers[reads[0]]
        else:
            layer = _caller(max(reads, key=order.__getitem__), reads, layers, owners, following[index])
        layers[binding.var.name] = layer
        order[binding.var.name] = index
    return list(layers.values())


def _caller(latest_read: str, reads: list[str], layers: dict[str, str], owners: set[str],
            upcoming: str | None) -> str:
    """The module that calls a compute op without weights (see `_layers`): `latest_read` is the latest
    op it reads, `upcoming` the module of the next op that reads weights."""
    common = common_path([layers[name] for name in reads])
    if common in owners:
        common = common.rpartition(".")[0]
    latest = layers[latest_read]
    around = common_path([latest, upcoming]) if upcoming is not None else common
    deeper, shallower = (around, common) if around.count(".") > common.count(".") else (common, around)
    return deeper if deeper.startswith(shallower) else common
