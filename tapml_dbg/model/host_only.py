"""Host-only ops: source ops TVM cannot import, kept in the graph as opaque placeholders.

An FX node whose aten (or allowlisted custom) op has no Relax converter in this TVM is imported as
one binding `R.call_dps_packed("tapml_dbg.host_only", (inputs...), out_ty=...)`: its tensor inputs
and the type torch computed, nothing else. The trace records the node's torch value for it like
any op's; the engine keeps it on the source in every replay (engine/kept.py: cut out of the
target's units, its recorded value or the host's re-execution feeds the ops after it) and lists it
as a finding (docs/host-only-ops.md). No packed function of that name exists anywhere: a unit that
held one would fail loudly on the target ("Cannot find ffi::Function tapml_dbg.host_only"), never
give a plausible value.

The trace stores the placeholder as its own expression kind (model/serialize.py), so a stored graph
still calls no function it names: the name above is this module's constant, never the file's.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_ONLY_FUNC = "tapml_dbg.host_only"  # the placeholder's (non-existent) packed function
DPS_PACKED = "relax.call_dps_packed"


@dataclass(frozen=True)
class HostOnlyOp:
    """One host-only op, as a finding: `reason` says why TVM cannot run it."""

    index: int
    name: str
    op: str  # the source operator, e.g. aten.histc.default
    reason: str  # "TVM 0.27 has no converter for aten.histc"

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "op": self.op, "reason": self.reason}


def no_converter_reason(target: str, tvm_version: str) -> str:
    """`TVM 0.27 has no converter for aten.histc` (the overload dropped: `aten.histc.default`)."""
    short = target[: -len(".default")] if target.endswith(".default") else target
    major_minor = ".".join(str(tvm_version).split(".")[:2]) or str(tvm_version)
    return f"TVM {major_minor} has no converter for {short}"


def is_host_only_call(value) -> bool:
    """Whether a Relax binding value is the host-only placeholder."""
    from tvm import relax

    if not isinstance(value, relax.Call) or getattr(value.op, "name", None) != DPS_PACKED or not value.args:
        return False
    func = value.args[0]
    return isinstance(func, relax.ExternFunc) and str(func.global_symbol) == HOST_ONLY_FUNC


def placeholder(args: list, out_types: list):
    """The placeholder call for tensor inputs `args` and output types `out_types` (one per tensor)."""
    from tvm import relax

    return relax.call_dps_packed(relax.ExternFunc(HOST_ONLY_FUNC), relax.Tuple(list(args)),
                                 out_types[0] if len(out_types) == 1 else list(out_types))


def host_only_names(main) -> list[str]:
    """The binding names of `main` that are host-only placeholders, in order."""
    return [binding.var.name for block in main.body.blocks for binding in block.bindings
            if is_host_only_call(binding.value)]


def host_only_text(entries: list[dict]) -> str:
    """Host-only ops (their JSON form) grouped by reason, one line:
    `TVM 0.27 has no converter for aten.histc: #137 histc; TVM 0.27 has no converter for ...: #140 ..., #148 ...`."""
    by_reason: dict[str, list[str]] = {}
    for entry in entries:
        by_reason.setdefault(str(entry.get("reason", "")), []).append(f"#{entry.get('index')} {entry.get('name')}")
    return "; ".join(f"{reason}: {', '.join(ops)}" for reason, ops in by_reason.items())
