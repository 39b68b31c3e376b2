"""Paged-KV-cache calls as graph bindings: TVM's attention over its paged cache, its state as data.

A TVM-native LLM's `prefill`/`decode` call `vm.builtin.attention_kv_cache_attention_with_fused_qkv`
on a cache object (frontend/native_llm.py). The unrolled graph of a generation holds each such
call as one binding of `portable/paged_kv.py`'s packed function, the state explicit:

    R.call_dps_packed("tapml_dbg.paged_kv.attention_with_fused_qkv",
                      (qkv, [keys_before, values_before], R.str(config)), out=(out, keys_after, values_after))

so the cache flows between steps as values (a decode step's call reads the keys and values the
same layer's call of the step before it returned), every call is a unit of the search like any op,
and its isolated verdict feeds it the recorded state. The trace stores the binding as its own
expression kind (model/serialize.py: `paged_kv`, a config of numbers): no function name is read
from the file.
"""

from __future__ import annotations

from tapml_dbg.portable.paged_kv import ATTENTION_FUNC, BUILTIN, config_text, parse_config

DPS_PACKED = "relax.call_dps_packed"
PAGED_KV_OP = BUILTIN  # the op's name in the trace: the builtin users see in their module


def is_paged_kv_call(value) -> bool:
    """Whether a Relax binding value is a recorded paged-KV attention call."""
    from tvm import relax

    if not isinstance(value, relax.Call) or getattr(value.op, "name", None) != DPS_PACKED or not value.args:
        return False
    func = value.args[0]
    return isinstance(func, relax.ExternFunc) and str(func.global_symbol) == ATTENTION_FUNC


def paged_kv_call(tensors: list, config: dict, out_types: list):
    """The call for tensor inputs (qkv, and the state before it unless it is the first), its config
    (portable/paged_kv.py's keys) and its three output types."""
    import tvm
    from tvm import relax

    args = [*tensors, tvm.ir.StringImm(config_text(config))]
    return relax.call_dps_packed(relax.ExternFunc(ATTENTION_FUNC), relax.Tuple(args), list(out_types))


def call_parts(value) -> tuple[list, dict, list]:
    """(tensor inputs, config, output types) of a paged-KV call."""
    fields = list(value.args[1].fields)
    return fields[:-1], parse_config(str(fields[-1].value)), list(value.ty_args[0].fields)
