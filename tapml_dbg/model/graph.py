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


@dataclass(frozen=True)
class SourceLocation:
    """Where an op comes from: the 1-based line of a file and that line's code as read at record time.

    In the user's own file (`library` None): the file relative to the directory `record` ran in when
    under it, else absolute. In a library's (`library`, e.g. "transformers": a model used from it, whose
    line is in `modeling_llama.py`): the file relative to the folder the package is installed in
    (`transformers/models/llama/modeling_llama.py`), and `user` the user's innermost frame above it
    (None: the model was used straight from the library)."""

    file: str
    line: int
    code: str
    library: str | None = None  # the installed package the file belongs to; None: the user's own file
    user: "SourceLocation | None" = None  # under a library line: the user's innermost frame that called it

    def to_json(self) -> dict:
        """A user's line as `{"file", "line", "code"}`; a library's adds `"library"` and `"user"` (its
        user's frame in the same form, or null)."""
        data = {"file": self.file, "line": self.line, "code": self.code}
        if self.library is not None:
            data.update(library=self.library, user=self.user.to_json() if self.user else None)
        return data

    @staticmethod
    def from_json(data: dict | None) -> "SourceLocation | None":
        if data is None:
            return None
        library = data.get("library")
        return SourceLocation(str(data["file"]), int(data["line"]), str(data.get("code", "")),
                              str(library) if library is not None else None,
                              SourceLocation.from_json(data.get("user")) if library is not None else None)

    def __str__(self) -> str:  # what the CLI, the REPL, the report and the READMEs show: `file:line`
        return f"{self.file}:{self.line}"


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
    source_location: SourceLocation | None = None  # None: no frame of the user's or a library's files (frontend/source_location.py)
    # (output, spec) where TVM's stock importer declares another type than `outputs` (an import fix
    # changed it; see frontend/stock_import.py); [] when they agree, and in traces before it existed
    stock_outputs: list[tuple[int, TensorSpec]] = field(default_factory=list)
    step: int | None = None  # the generation step it belongs to (0 = the prefill); None outside a generation trace

    def to_json(self) -> dict:
        data = asdict(self)
        data["outputs"] = [spec.to_json() for spec in self.outputs]
        data["source_location"] = self.source_location.to_json() if self.source_location else None
        data["stock_outputs"] = [{"output": k, **spec.to_json()} for k, spec in self.stock_outputs]
        if self.step is None:  # outside a generation trace: no key, so such a trace's bytes stay as they were
            del data["step"]
        return data

    @staticmethod
    def from_json(data: dict) -> "OpInfo":
        fields = dict(data)
        fields["outputs"] = [TensorSpec.from_json(spec) for spec in data.get("outputs", [])]
        fields["inputs"] = list(data.get("inputs", []))
        fields["source_location"] = SourceLocation.from_json(data.get("source_location"))  # absent before it existed
        fields["stock_outputs"] = [(int(item["output"]), TensorSpec.from_json(item))
                                   for item in data.get("stock_outputs") or []]  # absent before it existed
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
    stock: object = None  # frontend.stock_import.StockImport: what TVM's stock importer does (None: not compared)
    # FX node -> the ops its converter emitted, in order (None: one the graph no longer holds); set by the import
    emitted: dict[str, list[str | None]] = field(default_factory=dict)
    host_only: list = field(default_factory=list)  # model.host_only.HostOnlyOp: ops TVM cannot import, run on the host
