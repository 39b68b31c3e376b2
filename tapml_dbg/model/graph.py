"""The model graph the whole tool works on: a Relax `main` plus one `OpInfo` per binding.

Op names are the binding names of `main`, so an op named in the CLI, in a trace and in a
`--transform` pass is the same thing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor (dtype spelled as in TVM: float32, bfloat16, bool)."""

    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(data: dict) -> "TensorSpec":
        return TensorSpec(tuple(int(d) for d in data["shape"]), str(data["dtype"]))


@dataclass
class OpInfo:
    """One binding of `main`: what it computes, where it came from, what it reads."""

    index: int
    name: str
    op: str  # source operator: the aten target for a torch source, else the Relax op
    relax_op: str  # e.g. relax.matmul; "tuple", "get_item", "alias" for structural bindings
    layer: str  # nn.Module path, "" at top level
    fx_node: str = ""  # FX node that produced it ("" when none)
    inputs: list[str] = field(default_factory=list)  # free variable names, in order
    outputs: list[TensorSpec] = field(default_factory=list)  # flattened when a tuple
    is_tuple: bool = False

    def to_json(self) -> dict:
        data = asdict(self)
        data["outputs"] = [spec.to_json() for spec in self.outputs]
        return data

    @staticmethod
    def from_json(data: dict) -> "OpInfo":
        fields = dict(data)
        fields["outputs"] = [TensorSpec.from_json(spec) for spec in data.get("outputs", [])]
        fields["inputs"] = list(data.get("inputs", []))
        return OpInfo(**fields)


@dataclass
class Graph:
    """An imported model: `mod["main"]` has the model inputs then the params as parameters."""

    mod: object  # tvm.IRModule; typed loosely so importing this file needs no TVM
    ops: list[OpInfo]
    inputs: list[tuple[str, TensorSpec]]
    params: list[tuple[str, TensorSpec]]
    outputs: list[str]  # names of the ops (or inputs) the model returns
    import_fixes: list[str] = field(default_factory=list)  # see frontend/fixes.py
