"""The source runner: re-executes FX nodes of a trace's source graph on torch CPU, from the trace alone.

The graph comes from `trace/source_graph.py`, which has validated every name; here each target
is looked up on `torch.ops.aten` (packet and overload must exist and be an `OpOverload`), never
evaluated. A node runs in the recorded dtype (then it reproduces the recorded value bit for bit)
or with every floating tensor and dtype promoted to float64: the reference the noise floor is
measured against (docs/tolerance.md).

Inputs of a node come from, in order of preference: values the caller hands in, the trace's
recorded values (an op that holds the node's value, a model input or a param), or running the
node that computes them (recursively, in graph order). `full_run` runs the whole graph from the
model's inputs and params instead: in float64, every op's propagated reference.

`undefined_masks` says which elements of which values are uninitialised memory (`torch.empty`
and what copies it), so that nothing undefined is ever judged.
"""

from __future__ import annotations

import contextlib
import importlib
import operator
from typing import Callable, Iterator

import numpy as np

from tapml_dbg.model.graph import OpInfo
from tapml_dbg.host.torch_values import to_numpy, to_torch
from tapml_dbg.trace import source_graph as SG

FetchOp = Callable[[str], "list[np.ndarray] | None"]  # op name -> its recorded outputs (None: not recorded)
FetchPlaceholder = Callable[[str, str], np.ndarray]  # (kind, trace name) -> a model input or param

SKIPPED_TARGETS = frozenset(["aten._assert_tensor_metadata.default"])  # checks only; their value is None
# ops whose value is built from their data inputs' elements by moving them: the undefined mask of
# the result is the op run on the inputs' masks. Values: the argument positions holding data.
MASK_MOVES = {
    "slice": (0,), "select": (0,), "view": (0,), "_unsafe_view": (0,), "reshape": (0,), "permute": (0,),
    "expand": (0,), "unsqueeze": (0,), "squeeze": (0,), "clone": (0,), "alias": (0,), "_to_copy": (0,),
    "t": (0,), "flip": (0,), "repeat": (0,), "detach": (0,), "lift_fresh_copy": (0,), "contiguous": (0,),
    "slice_scatter": (0, 1), "select_scatter": (0, 1), "copy": (0, 1), "cat": (0,), "split_with_sizes": (0,),
    "split": (0,), "unbind": (0,), "index": (0,), "index_select": (0,), "gather": (0,), "index_put": (0, 2),
    "constant_pad_nd": (0,), "as_strided": (0,), "diagonal": (0,),
}
# ops computing each element from the same element of their (broadcast) inputs
ELEMENTWISE = frozenset("""
abs acos acosh add asin asinh atan atan2 atanh bitwise_and bitwise_not bitwise_or bitwise_xor ceil clamp cos
cosh div elu eq erf exp expm1 floor fmod ge gelu gt hardtanh isinf isnan le leaky_relu log log10 log1p log2
logical_and logical_not logical_or logical_xor lt maximum minimum mul ne neg pow reciprocal relu remainder
round rsqrt sigmoid sign sin sinh sqrt sub tan tanh trunc where
""".split())


class SourceRunError(Exception):
    """A node cannot be re-executed from the trace: an opaque argument, a value the trace lacks, or
    torch refused it. The engine then has no float64 reference for the op and says so."""


# ---------------------------------------------------------------------------- lining values up
def source_outputs(value, prov, op: OpInfo) -> list | None:
    """The tensors of FX value `value` that are `op`'s outputs, in order, or None when they do not line up.

    `prov` is where the op's value sits in the node's value (`.index`: None for all of it, else a
    path into its tuple). Works on real tensors and on the export's meta (fake) tensors alike.
    Shapes and dtypes may differ from the op's declared ones (a type change); only the count and
    the path must fit. THE rule: the recorder stores what it returns, the trace's type changes
    are computed with it, and the engine's references are picked with it.
    """
    import torch

    if value is None or not op.outputs:
        return None
    for index in prov.index or ():
        if not isinstance(value, (tuple, list)) or index >= len(value):
            return None
        value = value[index]
    flat = list(_flatten(value))
    if not op.is_tuple and len(flat) > 1:  # one field of a multi-output node: the one of the declared shape
        flat = [t for t in flat if isinstance(t, torch.Tensor) and tuple(t.shape) == op.outputs[0].shape][:1]
    if len(flat) != len(op.outputs) or not all(isinstance(t, torch.Tensor) for t in flat):
        return None
    return flat


def _flatten(value):
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flatten(item)
    elif value is not None:
        yield value


# ---------------------------------------------------------------------------- targets and literals
def resolve_target(target: str):
    """The callable of a validated target name: an `OpOverload` of `torch.ops.aten`, an allowlisted
    custom op (`SG.ALLOWED_CUSTOM_OPS`), or getitem."""
    import torch

    if target == SG.GETITEM:
        return operator.getitem
    if target in SG.ALLOWED_CUSTOM_OPS:
        return _custom_op(target)
    parts = target.split(".")
    if len(parts) != 3 or parts[0] != "aten" or parts[1] not in SG.ALLOWED_ATEN_OPS:
        raise SourceRunError(f"{target} is not an allowed source op")
    try:
        packet = getattr(torch.ops.aten, parts[1])
    except (AttributeError, RuntimeError) as exc:
        raise SourceRunError(f"torch {torch.__version__} has no aten op {parts[1]}") from exc
    if not isinstance(packet, torch._ops.OpOverloadPacket) or parts[2] not in packet.overloads():
        raise SourceRunError(f"torch {torch.__version__} has no overload {target}")
    overload = getattr(packet, parts[2])
    if not isinstance(overload, torch._ops.OpOverload):
        raise SourceRunError(f"{target} is not an aten overload")
    return overload


def _custom_op(target: str):
    """An allowlisted custom op's `OpOverload`: its registering module (the allowlist's, never the
    trace's) imported, then `torch.ops.NAMESPACE.NAME.OVERLOAD` looked up by name."""
    import torch

    namespace, name, overload = target.split(".")
    try:
        importlib.import_module(SG.ALLOWED_CUSTOM_OPS[target])
        packet = getattr(getattr(torch.ops, namespace), name)
    except (ImportError, AttributeError, RuntimeError) as exc:
        raise SourceRunError(f"{target} is not registered here (import {SG.ALLOWED_CUSTOM_OPS[target]} "
                             f"failed or does not define it: {type(exc).__name__}: {exc})") from exc
    if not isinstance(packet, torch._ops.OpOverloadPacket) or overload not in packet.overloads():
        raise SourceRunError(f"torch {torch.__version__} has no overload {target}")
    return getattr(packet, overload)


def _torch_name(value: SG.TorchName, promote: bool):
    import torch

    if value.kind == "dtype":
        dtype = getattr(torch, value.name)
        return _promoted_dtype(dtype) if promote else dtype
    if value.kind == "memory_format":
        return getattr(torch, value.name)
    if value.kind == "layout":
        return torch.strided
    return torch.device("cpu")  # the runner runs on the host, whatever device the export saw


def with_layout(tensor, meta):
    """`tensor` (contiguous, as the trace stores it) laid out with the strides eager gave the value.

    Kernels pick their path by layout (a transposed matmul operand takes another BLAS kernel and
    rounds differently), so a re-executed node reproduces the recorded bits only when its inputs
    have their eager strides. Expanded dimensions (stride 0) are rebuilt by `expand`, the rest by
    copying into storage of those strides.
    """
    import torch

    stride = getattr(meta, "stride", None)
    if stride is None or tuple(tensor.shape) != tuple(meta.shape) or tuple(tensor.stride()) == stride:
        return tensor
    expanded = [d for d, (size, step) in enumerate(zip(tensor.shape, stride)) if step == 0 and size > 1]
    base = tensor
    for dim in expanded:
        base = base.narrow(dim, 0, 1)
    inner = tuple(1 if d in expanded else step for d, step in enumerate(stride))
    try:
        laid = torch.empty_strided(tuple(base.shape), inner, dtype=tensor.dtype)
        laid.copy_(base)
    except RuntimeError:  # strides that overlap: keep the contiguous value
        return tensor
    return laid.expand(tuple(tensor.shape)) if expanded else laid


def _promoted_dtype(dtype):
    import torch

    if dtype.is_floating_point:
        return torch.float64
    if dtype.is_complex:
        return torch.complex128
    return dtype


def promote_value(value):
    """Every floating tensor in `value` as float64 (complex as complex128); the rest unchanged."""
    import torch

    if isinstance(value, torch.Tensor):
        wanted = _promoted_dtype(value.dtype)
        return value if wanted == value.dtype else value.to(wanted)
    if isinstance(value, (tuple, list)):
        return type(value)(promote_value(item) for item in value)
    return value


@contextlib.contextmanager
def _default_dtype(promote: bool):
    """Ops that make floats without a dtype make float64 ones in a promoted run."""
    import torch

    if not promote:
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


# ---------------------------------------------------------------------------- the runner
class SourceRunner:
    """Re-execute nodes of one trace's source graph; values come from the trace through two callbacks."""

    def __init__(self, graph: SG.SourceGraph, fetch_op: FetchOp, fetch_placeholder: FetchPlaceholder):
        self.graph = graph
        self.fetch_op = fetch_op
        self.fetch_placeholder = fetch_placeholder
        self.position = {node.name: i for i, node in enumerate(graph.nodes)}
        self.whole_value_op: dict[str, str] = {}  # node -> the op holding its whole value
        for op, held in graph.op_values.items():
            if held.index is None:
                self.whole_value_op.setdefault(held.node, op)
        self._callables: dict[str, object] = {}

    # -- one node ---------------------------------------------------------------------------
    def callable_of(self, node: SG.SourceNode):
        if node.opaque or node.target is None:
            raise SourceRunError(f"node {node.name} cannot be re-executed ({node.opaque or 'no target'})")
        if node.target not in self._callables:
            self._callables[node.target] = resolve_target(node.target)
        return self._callables[node.target]

    def run(self, names: list[str], promote: bool = False, given: dict | None = None) -> dict[str, object]:
        """Execute nodes `names` (always) and what they need that neither `given` nor the trace holds.

        Returns every value computed or fetched, by node name (torch values; promoted when `promote`).
        """
        env: dict[str, object] = dict(given or {})
        wanted = [name for name in names if name in self.position]
        if len(wanted) != len(names):
            raise SourceRunError(f"no source node named {sorted(set(names) - set(wanted))[0]}")
        needed = self._plan(wanted, env, promote)
        for name in sorted(needed, key=self.position.__getitem__):
            env[name] = self._execute(self.graph.by_name[name], env, promote)
        return env

    def arguments(self, name: str, promote: bool = False) -> tuple[list, dict]:
        """Node `name`'s args and kwargs resolved to torch values from the trace (the node does not run)."""
        env: dict[str, object] = {}
        needed = self._plan([name], env, promote) - {name}
        for other in sorted(needed, key=self.position.__getitem__):
            env[other] = self._execute(self.graph.by_name[other], env, promote)
        node = self.graph.by_name[name]
        return (self._resolve(node.args, env, promote),
                {key: self._resolve(value, env, promote) for key, value in node.kwargs.items()})

    def _plan(self, wanted: list[str], env: dict, promote: bool) -> set[str]:
        """The nodes to execute: `wanted`, plus inputs neither given nor recorded (fetched into env)."""
        needed: set[str] = set()
        stack = list(wanted)
        while stack:
            name = stack.pop()
            if name in needed:
                continue
            needed.add(name)
            node = self.graph.by_name[name]
            for ref in SG.refs_of([node.args, node.kwargs]):
                if ref.kind != "node" or ref.name in env or ref.name in needed:
                    continue
                recorded = self.recorded_value(ref.name, promote)
                if recorded is not None:
                    env[ref.name] = recorded
                else:
                    stack.append(ref.name)
        return needed

    def _execute(self, node: SG.SourceNode, env: dict, promote: bool):
        if node.target in SKIPPED_TARGETS:
            return None
        function = self.callable_of(node)
        args = self._resolve(node.args, env, promote)
        kwargs = {key: self._resolve(value, env, promote) for key, value in node.kwargs.items()}
        import torch

        try:
            with torch.no_grad(), _default_dtype(promote):
                return function(*args, **kwargs)
        except Exception as exc:  # torch's own refusal: no reference for this node
            raise SourceRunError(f"re-executing {node.name} ({node.target}) failed: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc

    def _resolve(self, value, env: dict, promote: bool):
        if isinstance(value, SG.Ref):
            if value.kind == "node":
                if value.name not in env:
                    raise SourceRunError(f"no value for node {value.name}")
                return env[value.name]
            return self.placeholder_value(value.name, promote)
        if isinstance(value, SG.TorchName):
            return _torch_name(value, promote)
        if isinstance(value, SG.Opaque):
            raise SourceRunError(f"an argument is opaque ({value.what})")
        if isinstance(value, list):
            return [self._resolve(item, env, promote) for item in value]
        if isinstance(value, tuple):
            return tuple(self._resolve(item, env, promote) for item in value)
        return value

    # -- values from the trace ----------------------------------------------------------------
    def placeholder_value(self, name: str, promote: bool):
        kind, trace_name = self.graph.placeholders.get(name, (SG.ABSENT, name))
        if kind == SG.ABSENT:
            raise SourceRunError(f"placeholder {name} has no value in the trace")
        array = self.graph.constants[name] if kind == SG.CONSTANT else self.fetch_placeholder(kind, trace_name)
        value = with_layout(to_torch(array), self.graph.placeholder_meta.get(name))
        return promote_value(value) if promote else value

    def recorded_value(self, name: str, promote: bool):
        """A node's value rebuilt from the op that recorded it whole, or None."""
        op = self.whole_value_op.get(name)
        if op is None:
            return None
        arrays = self.fetch_op(op)
        if arrays is None:
            return None
        node = self.graph.by_name[name]
        tensors = [to_torch(a) for a in arrays]
        if isinstance(node.val, list):
            value = _rebuild(node.val, tensors)
        else:
            value = with_layout(tensors[0], node.val) if len(tensors) == 1 else None
        if value is None:
            return None
        return promote_value(value) if promote else value

    # -- ops ----------------------------------------------------------------------------------
    def holds(self, op: str) -> bool:
        """Whether op `op` holds an FX node's value (else it is a helper binding, no node of its own)."""
        return op in self.graph.op_values

    def op_value(self, op: OpInfo, promote: bool = False, given: dict | None = None) -> list[np.ndarray]:
        """Op `op`'s value recomputed: its node re-executed from its recorded inputs (or `given` ones)."""
        held = self.graph.op_values.get(op.name)
        if held is None:
            raise SourceRunError(f"op {op.name} holds no FX node's value (a helper binding)")
        env = self.run([held.node], promote, given)
        return self.outputs_of(op, env[held.node])

    def outputs_of(self, op: OpInfo, node_value) -> list[np.ndarray]:
        """The op's outputs picked out of its node's value (`source_outputs`), as numpy arrays."""
        held = self.graph.op_values[op.name]
        tensors = source_outputs(node_value, held, op)
        if tensors is None:
            raise SourceRunError(f"the value of node {held.node} does not line up with op {op.name}")
        return [to_numpy(t) for t in tensors]

    def full_run(self, promote: bool = True) -> Iterator[tuple[str, object]]:
        """Every node in graph order, run from the model's inputs and params: (name, value) as it comes.

        A value is dropped after its last consumer (read it when it is yielded). Undefined nodes
        (torch.empty, random ops) take their recorded value when the trace holds it, so the run
        agrees with the source wherever nothing is defined.
        """
        last_use: dict[str, int] = {}
        for position, node in enumerate(self.graph.nodes):
            for ref in SG.refs_of([node.args, node.kwargs]):
                if ref.kind == "node":
                    last_use[ref.name] = position
        env: dict[str, object] = {}
        for position, node in enumerate(self.graph.nodes):
            value = self.recorded_value(node.name, promote) if node.undefined else None
            if value is None:
                try:
                    value = self._execute(node, env, promote)
                except SourceRunError:
                    value = self.recorded_value(node.name, promote)  # the trace's value keeps the run going
                    if value is None:
                        raise
            env[node.name] = value
            yield node.name, value
            for ref in SG.refs_of([node.args, node.kwargs]):
                if ref.kind == "node" and last_use.get(ref.name) == position:
                    env.pop(ref.name, None)

    # -- undefined values -----------------------------------------------------------------------
    def undefined_masks(self) -> dict[str, object]:
        """Node -> its undefined elements (a bool tensor, or a tuple of them), for every node whose value
        holds uninitialised memory; nodes absent from the result are fully defined. (Without such a
        node, the usual case, torch is not needed: a search asks before its first unit runs.)"""
        masks: dict[str, object] = {}
        if not any(node.undefined for node in self.graph.nodes):
            return masks
        for node in self.graph.nodes:
            if node.undefined:
                masks[node.name] = _full_mask(node.val, True)
                continue
            inputs = [ref.name for ref in SG.refs_of([node.args, node.kwargs]) if ref.kind == "node"]
            if not any(name in masks for name in inputs):
                continue
            try:
                mask = self._mask_of(node, masks)
            except (SourceRunError, RuntimeError, TypeError, ValueError, IndexError):
                mask = _full_mask(node.val, True)  # cannot tell which elements: all of them
            if mask is not None and _any_true(mask):
                masks[node.name] = mask
        return masks

    def _mask_of(self, node: SG.SourceNode, masks: dict):
        import torch

        name = node.aten_name or ("getitem" if node.target == SG.GETITEM else "")
        if name == "getitem":
            source = masks.get(node.args[0].name) if isinstance(node.args[0], SG.Ref) else None
            return None if source is None else source[node.args[1]]
        if name in MASK_MOVES:
            positions = MASK_MOVES[name]
            args = list(node.args)
            for position in positions:
                if position < len(args):
                    args[position] = self._mask_arg(args[position], masks)
            if name == "constant_pad_nd" and len(args) > 2:
                args[2] = 0  # the padding itself is defined
            function = self.callable_of(node)
            kwargs = {key: self._resolve(value, {}, False) for key, value in node.kwargs.items() if key != "dtype"}
            resolved = [self._resolve_mask_arg(arg) for arg in args]
            with torch.no_grad():
                result = function(*resolved, **kwargs)
            return _as_bool(result)
        if name in ELEMENTWISE and isinstance(node.val, SG.TensorMeta):
            mask = torch.zeros(node.val.shape, dtype=torch.bool)
            for ref in SG.refs_of(node.args):
                if ref.kind == "node" and ref.name in masks and isinstance(masks[ref.name], torch.Tensor):
                    mask = mask | masks[ref.name].expand_as(mask) if masks[ref.name].dim() <= mask.dim() else mask
            return mask
        return _full_mask(node.val, True)

    def _mask_arg(self, arg, masks: dict):
        """A data argument as its mask (a `_MaskValue`), defined values as all-False masks."""
        if isinstance(arg, list):
            return [self._mask_arg(item, masks) for item in arg]
        if isinstance(arg, SG.Ref):
            if arg.kind == "node" and arg.name in masks:
                return _MaskValue(masks[arg.name])
            spec = self.graph.by_name[arg.name].val if arg.kind == "node" else None
            if spec is None and arg.kind != "node":
                spec = self.placeholder_value(arg.name, False)
                return _MaskValue(_full_mask_like(spec))
            return _MaskValue(_full_mask(spec, False))
        return arg

    def _resolve_mask_arg(self, arg):
        if isinstance(arg, _MaskValue):
            return arg.mask
        if isinstance(arg, list):
            return [self._resolve_mask_arg(item) for item in arg]
        if isinstance(arg, SG.Ref):
            if arg.kind != "node":
                return self.placeholder_value(arg.name, False)
            value = self.recorded_value(arg.name, False)
            if value is None:
                value = self.run([arg.name])[arg.name]
            return value
        return self._resolve(arg, {}, False)


class _MaskValue:
    def __init__(self, mask):
        self.mask = mask


def _full_mask(val, fill: bool):
    import torch

    if isinstance(val, SG.TensorMeta):
        return torch.full(val.shape, fill, dtype=torch.bool)
    if isinstance(val, list):
        return tuple(_full_mask(item, fill) for item in val)
    raise SourceRunError("no shape for an undefined value")


def _full_mask_like(tensor):
    import torch

    return torch.zeros(tensor.shape, dtype=torch.bool)


def _as_bool(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value != 0 if value.dtype != torch.bool else value
    if isinstance(value, (tuple, list)):
        return tuple(_as_bool(item) for item in value)
    raise SourceRunError("a mask op gave no tensor")


def _any_true(mask) -> bool:
    import torch

    if isinstance(mask, torch.Tensor):
        return bool(mask.any())
    return any(_any_true(item) for item in mask)


def _rebuild(val: list, tensors: list):
    """A tuple value from its flattened tensors, shaped like the node's value meta (None if it does not fit)."""
    position = 0

    def build(meta):
        nonlocal position
        if isinstance(meta, list):
            items = [build(item) for item in meta]
            return None if any(item is None for item in items) else tuple(items)
        if isinstance(meta, SG.TensorMeta) and position < len(tensors):
            position += 1
            return tensors[position - 1]
        return None

    value = build(val)
    return value if position == len(tensors) else None
