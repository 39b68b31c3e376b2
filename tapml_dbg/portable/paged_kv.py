"""TVM's paged KV cache as a function of data: one `attention_with_fused_qkv` call, its state as tensors.

`ATTENTION_FUNC(qkv, [keys_before, values_before], config) -> (out, keys_after, values_after)` (DPS):
a fresh one-layer `TIRPagedKVCache` built for the device's target from `config` (numbers only), sequence
0 given the recorded state, then the real call (rotary, append, paged attention) and the state read
back. The state goes in and out through one TIR kernel put where the cache keeps its debug reader: it
swaps a tensor with the pages at the sequence's positions, so `attention_kv_cache_debug_get_kv` writes
the state on its first call and reads it on its second, bit for bit. docs/native-llm.md says more.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

ATTENTION_FUNC = "tapml_dbg.paged_kv.attention_with_fused_qkv"  # the packed function a recorded call names
BUILTIN = "vm.builtin.attention_kv_cache_attention_with_fused_qkv"  # the op it stands for, as users know it
CONFIG_KEYS = ("layer", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "rope_theta", "rope_scale",
               "rotary_dim", "page_size", "dtype")
MAX_TOTAL_SEQ_LEN_STEP = 128  # the cache's capacity, rounded up to this
_kits: dict = {}
_lock = threading.Lock()
_store: list[Path] = []  # where built cache modules are kept across processes (`register`'s folder), if anywhere


def parse_config(text: str) -> dict:
    """The config string of a recorded call, checked."""
    return check_config(json.loads(text))


def check_config(config) -> dict:
    """A call's config: exactly CONFIG_KEYS, numbers (and a dtype) only."""
    if not isinstance(config, dict) or set(config) != set(CONFIG_KEYS):
        raise ValueError(f"a paged-KV call's config must have exactly the keys {', '.join(CONFIG_KEYS)}")
    for key in CONFIG_KEYS:
        value = config[key]
        if key == "dtype":
            if value not in ("float32", "float16", "bfloat16"):
                raise ValueError(f"a paged-KV call's dtype must be float32, float16 or bfloat16, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"a paged-KV call's {key} must be a non-negative number, not {value!r}")
    return config


def config_text(config: dict) -> str:
    """The canonical string of a config (sorted keys): equal configs, equal units."""
    return json.dumps({key: config[key] for key in CONFIG_KEYS}, sort_keys=True)


def register(store: str | Path | None = None) -> None:
    """Make `ATTENTION_FUNC` callable from compiled units in this process (idempotent). `store`: a folder
    where each built cache module is kept for later processes (a session's workers and later sessions
    then load it instead of building TVM's paged-KV kernels again, seconds each); None builds in memory."""
    import tvm

    if store is not None:
        _store[:] = [Path(store)]
    if tvm.get_global_func(ATTENTION_FUNC, allow_missing=True) is None:
        tvm.register_global_func(ATTENTION_FUNC, _attention, override=True)


def _attention(*args) -> None:
    """The packed function: `args` are the call's inputs, its config, then the three outputs (DPS)."""
    import tvm
    from tvm.runtime import ShapeTuple

    inputs, config, (out, keys_after, values_after) = args[:-4], parse_config(str(args[-4])), args[-3:]
    qkv = inputs[0]
    before = inputs[1:] if len(inputs) == 3 else None
    device = qkv.device
    kit = _kit(config, device)
    cache = kit["create"](*(ShapeTuple([value]) for value in _cache_arguments(config, keys_after.shape[0],
                                                                               qkv.shape[0])))
    call = tvm.get_global_func
    call("vm.builtin.kv_state_add_sequence")(cache, 0)
    n_past, n_new = (int(before[0].shape[0]) if before else 0), int(qkv.shape[0])
    swap = call("vm.builtin.attention_kv_cache_debug_get_kv")
    if n_past:
        call("vm.builtin.kv_state_begin_forward")(cache, ShapeTuple([0]), ShapeTuple([n_past]), None)
        call("vm.builtin.kv_state_end_forward")(cache)
        keys, values = (_layer_copy(array, device) for array in before)
        swap(cache, 0, 0, n_past, keys, values)  # the pages take the given state
    call("vm.builtin.kv_state_begin_forward")(cache, ShapeTuple([0]), ShapeTuple([n_new]), None)
    call(BUILTIN)(cache, 0, float(config["sm_scale"]), qkv, out)
    keys, values = (tvm.runtime.empty((1, *keys_after.shape), keys_after.dtype, device) for _ in range(2))
    swap(cache, 0, 0, n_past + n_new, keys, values)  # the pages' state comes out
    call("vm.builtin.kv_state_end_forward")(cache)
    keys_after.copyfrom(keys.numpy()[0])
    values_after.copyfrom(values.numpy()[0])


def _layer_copy(array, device):
    """`array` (n, kv heads, d) as a fresh (1, n, kv heads, d) tensor: the swap overwrites it."""
    import tvm

    return tvm.runtime.tensor(array.numpy()[None], device)


def _cache_arguments(config: dict, total: int, new: int) -> list[int]:
    """create's arguments: batch 1, room for the sequence, a prefill chunk that takes the new tokens."""
    step = MAX_TOTAL_SEQ_LEN_STEP
    room = max(step, -(-total // step) * step)
    return [1, room, max(new, 16), int(config["page_size"]), 0]


def _kit(config: dict, device) -> dict:
    """The compiled cache module for `config` on `device`'s target, built once per process."""
    target = _target_of(device)
    key = (config_text({**config, "layer": 0, "sm_scale": 0}), str(target), device.dlpack_device_type(),
           device.index)
    with _lock:
        if key not in _kits:
            _kits[key] = _stored_or_built(config, target, device)
        return _kits[key]


def _target_of(device):
    from tvm.target import Target

    if device.dlpack_device_type() == 1:  # kDLCPU
        return Target("llvm")
    return Target.from_device(device)


def _stored_or_built(config: dict, target, device) -> dict:
    """The cache module's kit: loaded from the store when it holds it intact, else built (and stored)."""
    import tvm
    from tvm import relax

    path = _stored_path(config, target)
    if path is not None and _intact(path):
        try:
            return _kit_of(relax.VirtualMachine(tvm.runtime.load_module(str(path)), device))
        except Exception:  # noqa: BLE001 - it does not load here: built again below
            pass
    executable = _build(config, target)
    if path is not None:
        _keep(executable, path)
    return _kit_of(relax.VirtualMachine(executable, device))


def _kit_of(vm) -> dict:
    return {"create": vm["create"], "vm": vm}


def _stored_path(config: dict, target) -> Path | None:
    """The store's file for this config's cache module on `target`, by everything that makes it: the
    config's shape numbers, the target, TVM's version and this module's own kernels (its source)."""
    if not _store:
        return None
    import tvm

    made_of = "\n".join([config_text({**config, "layer": 0, "sm_scale": 0}), str(target), tvm.__version__,
                         hashlib.sha256(Path(__file__).read_bytes()).hexdigest()])
    return _store[0] / f"paged-kv-{hashlib.sha256(made_of.encode()).hexdigest()[:32]}.so"


def _intact(path: Path) -> bool:
    """The library there, its bytes the ones recorded beside it (a torn or damaged file is built again)."""
    try:
        return path.with_suffix(".sha256").read_text().strip() == hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return False


def _keep(executable, path: Path) -> None:
    """Store the built module (best effort: a store that cannot be written only costs the next build)."""
    partial = path.with_name(f"{path.stem}.tmp{os.getpid()}.so")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        executable.export_library(str(partial))
        digest = hashlib.sha256(partial.read_bytes()).hexdigest()
        os.replace(partial, path)
        path.with_suffix(".sha256").write_text(digest + "\n")
    except Exception:  # noqa: BLE001
        partial.unlink(missing_ok=True)  # (a half-written library is no one's)


def _build(config: dict, target):
    """TVM's one-layer paged KV cache for `config`, its debug reader the swap kernel, compiled for `target`."""
    import tvm
    from tvm.relax.frontend import nn

    module = _cache_module_class()(config, target)
    spec = nn.spec.ModuleSpec.from_raw({"create": {**{name: int for name in ("batch", "total", "chunk", "page",
                                                                             "window")},
                                                   "$": {"param_mode": "none", "effect_mode": "none"}}}, module)
    mod, _ = module.export_tvm(spec=spec)
    reader = next(gv for gv in mod.get_global_vars() if gv.name_hint == "tir_kv_cache_debug_get_kv")
    gpu = target.kind.name not in ("llvm", "c")
    swap = _swap_kernel(int(config["num_kv_heads"]), int(config["head_dim"]), config["dtype"], gpu=gpu)
    if gpu:  # bound to threads already: TVM's default GPU schedule must leave it as it is
        swap = swap.with_attr("tirx.is_scheduled", True)
    mod[reader] = swap.with_attr("global_symbol", "tir_kv_cache_debug_get_kv")
    return tvm.compile(mod, target=target)


def _cache_module_class():
    from tvm import relax
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn.llm.kv_cache import RopeMode, TIRPagedKVCache

    class CacheModule(nn.Module):
        """A one-layer `TIRPagedKVCache` of the recorded call's shape and rotary."""

        def __init__(self, config: dict, target):
            self.config, self.target = config, target

        def create(self, batch, total, chunk, page, window):
            config = self.config
            return TIRPagedKVCache(
                attn_kind="mha", max_batch_size=batch, max_total_seq_len=total, prefill_chunk_size=chunk,
                page_size=page, support_sliding_window=window, layer_partition=relax.ShapeExpr([0, 1]),
                num_hidden_layers=1, num_attention_heads=int(config["num_qo_heads"]),
                num_key_value_heads=int(config["num_kv_heads"]), qk_head_dim=int(config["head_dim"]),
                v_head_dim=int(config["head_dim"]), mla_original_qk_head_dim=0, mla_original_v_head_dim=0,
                rope_mode=RopeMode.NORMAL, rope_scale=config["rope_scale"], rope_theta=float(config["rope_theta"]),
                rope_scaling={}, rope_ext_factors=relax.prim_value(0), rotary_dim=int(config["rotary_dim"]),
                enable_disaggregation=False, dtype=config["dtype"], target=self.target)

    return CacheModule


def _swap_kernel(kv_heads: int, head_dim: int, dtype: str, gpu: bool = False):
    """TIR: swap `k_data`/`v_data` (1 layer, seqlen, heads, d) with the pages at `position_map`. On a GPU
    one block per position and one thread per (head, element): TVM's default GPU schedule cannot take a
    block that reads and writes the same buffers."""
    from tvm.script import tirx as T

    elem = getattr(T, dtype)  # the pages' element type, for the swap's locals

    @T.macro
    def body(pages, position_map, k_data, v_data, p, h, d, layer_id, page_size):
        with T.sblock("swap"):
            vp, vh, vd = T.axis.remap("SSS", [p, h, d])
            T.reads(position_map[vp], pages[position_map[vp] // page_size, 0:2, vh, position_map[vp] % page_size, vd],
                    k_data[layer_id, vp, vh, vd], v_data[layer_id, vp, vh, vd])
            T.writes(pages[position_map[vp] // page_size, 0:2, vh, position_map[vp] % page_size, vd],
                     k_data[layer_id, vp, vh, vd], v_data[layer_id, vp, vh, vd])
            position: T.int32 = position_map[vp]
            k_old = elem(pages[T.floordiv(position, page_size), 0, vh, T.floormod(position, page_size), vd])
            v_old = elem(pages[T.floordiv(position, page_size), 1, vh, T.floormod(position, page_size), vd])
            pages[T.floordiv(position, page_size), 0, vh, T.floormod(position, page_size), vd] = k_data[layer_id, vp, vh, vd]
            pages[T.floordiv(position, page_size), 1, vh, T.floormod(position, page_size), vd] = v_data[layer_id, vp, vh, vd]
            k_data[layer_id, vp, vh, vd] = k_old
            v_data[layer_id, vp, vh, vd] = v_old

    @T.prim_func(s_tir=True)
    def swap(var_pages: T.handle, var_position_map: T.handle, var_k_data: T.handle, var_v_data: T.handle,
             layer_id: T.int64):
        T.func_attr({"tirx.noalias": True})
        seqlen = T.Var("num_tokens_including_cache", "int64")
        page_size = T.Var("page_size", "int64")
        num_pages = T.int64()
        pages_elem_offset = T.int64()
        position_map_elem_offset = T.int64()
        pages = T.match_buffer(var_pages, (num_pages, 2, kv_heads, page_size, head_dim), dtype,
                               elem_offset=pages_elem_offset)
        position_map = T.match_buffer(var_position_map, (seqlen,), "int32", elem_offset=position_map_elem_offset)
        k_data = T.match_buffer(var_k_data, (1, seqlen, kv_heads, head_dim), dtype)
        v_data = T.match_buffer(var_v_data, (1, seqlen, kv_heads, head_dim), dtype)
        if gpu:
            for p in T.thread_binding(seqlen, thread="blockIdx.x"):
                for h in T.thread_binding(kv_heads, thread="threadIdx.y"):
                    for d in T.thread_binding(head_dim, thread="threadIdx.x"):
                        body(pages, position_map, k_data, v_data, p, h, d, layer_id, page_size)
        else:
            for p, h, d in T.grid(seqlen, kv_heads, head_dim):
                body(pages, position_map, k_data, v_data, p, h, d, layer_id, page_size)

    return swap
