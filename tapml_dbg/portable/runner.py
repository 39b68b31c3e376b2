"""Where and how one unit runs: the target, the device (local or over TVM RPC), build, load, run.

The engine's worker, its recorder and every repro use this `Runner`, so they compile with the
same pipeline, apply the same device-code check and label the place the same way.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import tempfile
import weakref

import numpy as np

from .codec import contiguous
from .errors import PortableError, one_line
from .loader import apply_transform
from .paged_kv import register as register_paged_kv

DEFAULT_TARGET = "llvm"
TARGET_HINT = "use e.g. llvm, cuda, or '{\"kind\":\"cuda\",\"arch\":\"sm_90\"}'"
CUDA_ARCH = re.compile(r"sm_\d+[a-z]?")  # sm_80, sm_90a, sm_100f: what nvcc and NVRTC take
HOST_KINDS = ("llvm", "c")  # target kinds whose code runs on the cpu device
HOST_MODULE_KINDS = ("llvm", "c", "static_library", "library")  # runtime modules that hold no device code
NO_DEVICE_HINT = "use --target, or --rpc HOST:PORT for a remote device"
SESSION_TIMEOUT_NONE = 0  # an RPC session without its own deadline: the caller times the unit
TRACKER_PRIORITY = 1
ENTRY = "main"  # the unit's Relax function


# ------------------------------------------------------------------------------ target, where
def parse_target(text: str | None):
    """A bare kind (`cuda`), a TVM target string, or a JSON dict such as {"kind":"cuda"}."""
    import tvm

    text = (text or DEFAULT_TARGET).strip()
    try:
        target = tvm.target.Target(json.loads(text) if text.startswith("{") else text)
    except Exception as exc:
        raise PortableError(f"invalid target {text!r}: {one_line(exc)} ({TARGET_HINT})") from exc
    for part in (target, target.host):
        problem = _refused_option(part) if part is not None else None
        if problem:
            raise PortableError(f"invalid target {text!r}: {problem}")
    return target


def _refused_option(target) -> str | None:
    """What TVM would only warn about, then ignore (an llvm `mcpu` or `mtriple` LLVM does not know: TVM
    logs it and compiles for a generic CPU) or accept and fail on later (a CUDA `arch` such as `sm_x`);
    None when the target is fine."""
    attrs, kind = target.attrs, target.kind.name
    if kind == "cuda" and "arch" in attrs and not CUDA_ARCH.fullmatch(str(attrs["arch"])):
        return f"CUDA arch {str(attrs['arch'])!r} is not sm_<number> (e.g. sm_80, sm_90a)"
    if kind != "llvm" or not ({"mcpu", "mtriple"} & set(attrs.keys())):
        return None
    import tvm
    from tvm.target import codegen

    if not hasattr(codegen._ffi_api, "llvm_is_valid_cpu"):  # a TVM built without LLVM: nothing to ask
        return None
    triple = str(attrs.get("mtriple") or codegen.llvm_get_system_triple())
    if "mtriple" in attrs and not codegen.llvm_is_valid_cpu("generic", triple):
        return f"LLVM does not know the mtriple {triple!r} (e.g. {codegen.llvm_get_system_triple()}, aarch64-linux-gnu)"
    cpu = str(attrs.get("mcpu", "generic"))
    if codegen.llvm_is_valid_cpu(cpu, triple):
        return None
    known = list(codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": triple})))
    here = triple == codegen.llvm_get_system_triple() and codegen.llvm_get_system_cpu()
    close = difflib.get_close_matches(cpu, known, n=3) or ([f"{here} (this machine's)"] if here else known[:3])
    return (f"LLVM does not know the mcpu {cpu!r} for {triple} (TVM would ignore it and compile for a generic CPU); "
            f"use one of its {len(known)} CPU names, e.g. {', '.join(close)}")


def device_kind(target) -> str:
    """The runtime device of a tvm.target.Target: `cpu` for host code, else the target's kind."""
    kind = target.kind.name
    return "cpu" if kind in HOST_KINDS else kind


def target_label(target: str, rpc: str | None = None, tracker: str | None = None, key: str | None = None) -> str:
    """`cuda`, `cuda via rpc HOST:PORT`, `cuda via tracker HOST:PORT key KEY`: the one wording of a place."""
    if rpc:
        return f"{target} via rpc {rpc}"
    if tracker:
        return f"{target} via tracker {tracker} key {key}"
    return target


# ------------------------------------------------------------------------------ inputs
GUARD_BYTES = 4096  # new random bytes each side of a cpu input: a read out of bounds differs run to run
ALIGNMENT = 64  # TVM's for a tensor's data
_NOISE = np.random.default_rng()


def guarded(array) -> np.ndarray | None:
    """A copy of `array` amid random bytes, aligned (None: a dtype numpy cannot hand TVM)."""
    array = contiguous(array)
    if array.dtype.kind not in "biuf" or not array.dtype.isnative:
        return None
    buffer = np.empty(array.nbytes + 2 * GUARD_BYTES + ALIGNMENT, np.uint8)
    start = (-buffer.ctypes.data) % ALIGNMENT + GUARD_BYTES
    end = start + array.nbytes
    buffer[:start], buffer[end:] = (_NOISE.integers(0, 256, n, np.uint8) for n in (start, buffer.size - end))
    placed = buffer[start:end].view(array.dtype).reshape(array.shape)
    placed[...] = array
    return placed


# ------------------------------------------------------------------------------ devices
def split_host_port(text: str | None, what: str) -> tuple[str, int]:
    host, sep, port = (text or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PortableError(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


def connect(rpc: str | None, tracker: str | None, key: str | None):
    """A remote session on a server (`--rpc`) or one leased from a tracker (`--tracker --key`)."""
    from tvm import rpc as tvm_rpc

    if rpc:
        host, port = split_host_port(rpc, "--rpc")
    else:
        host, port = split_host_port(tracker, "--tracker")
        if not key:
            raise PortableError("--tracker needs --key KEY (the device key the servers registered)")
    try:
        if rpc:
            return tvm_rpc.connect(host, port, session_timeout=SESSION_TIMEOUT_NONE)
        client = tvm_rpc.connect_tracker(host, port)
        return client.request(key, priority=TRACKER_PRIORITY, session_timeout=SESSION_TIMEOUT_NONE)
    except Exception as exc:
        raise PortableError(f"cannot reach the RPC endpoint {rpc or tracker}: {one_line(exc)} "
                            "(is `python -m tvm.exec.rpc_server` running there?)") from exc


def local_device(kind: str, hint: str = NO_DEVICE_HINT):
    """Device 0 of `kind` (`llvm` means the cpu) on this machine, or a one-line error ending in `hint`."""
    import tvm

    device = tvm.device("cpu" if kind in HOST_KINDS else kind, 0)
    if not device.exist:
        raise PortableError(f"no {kind} device on this machine ({hint})")
    return device


# ------------------------------------------------------------------------------ build
def build(mod, target, transform=None):
    """Apply the user's transform, lower with the target's default Relax pipeline, build.

    The pipeline is what `tvm.compile` would apply (dlight schedules for GPUs); lowering first
    shows whether the unit has kernels at all. A unit of view-like ops has none, but kernels
    compiled to host code only for a GPU target (an unscheduled PrimFunc: TVM does not complain)
    are a compile error, not a pass.
    """
    import tvm
    from tvm import relax

    if transform is not None:
        mod = apply_transform(transform, mod)
    with target:
        lowered = relax.get_default_pipeline(target)(mod)
    kernels = any(isinstance(func, tvm.tirx.PrimFunc) for _gv, func in lowered.functions_items())
    executable = tvm.compile(lowered, target, relax_pipeline=None)
    check_device_code(executable, target, kernels)
    return executable


def shared_entry(path) -> str:
    """A unit's entry in a library that several units' files share: named after the unit's own file."""
    return f"{ENTRY}_{os.path.splitext(os.path.basename(os.fspath(path)))[0]}"


def _entry_of(vm, path: str) -> str:
    """The unit's entry in a loaded library: ENTRY, or in a library several units share (tapml-dbg's
    compile cache builds small units together) `ENTRY_<file stem>`, the name of the unit's own file."""
    try:
        if vm.module.implements_function(ENTRY):
            return ENTRY
    except Exception:  # noqa: BLE001 - a module that cannot say (an older RPC server): the usual name
        return ENTRY
    named = shared_entry(path)
    try:
        return named if vm.module.implements_function(named) else ENTRY
    except Exception:  # noqa: BLE001
        return ENTRY


def check_device_code(executable, target, kernels: bool) -> None:
    """Raise when a non-host target's kernels produced no device module."""
    if kernels and target.kind.name not in HOST_KINDS and not has_device_module(executable):
        raise PortableError(f"no device code was generated for {target.kind.name} (the unit compiled to "
                            "host code only: is a GPU schedule missing?)")


def has_device_module(executable) -> bool:
    """Whether any module imported by the executable's library is a device module (cuda, opencl...)."""
    module = getattr(executable, "mod", executable)
    stack = list(_imports(module))
    while stack:
        sub = stack.pop()
        kind = getattr(sub, "kind", None) or getattr(sub, "type_key", "")
        if kind and kind not in HOST_MODULE_KINDS:
            return True
        stack.extend(_imports(sub))
    return False


def _imports(module) -> list:
    return list(getattr(module, "imports", None) or getattr(module, "imported_modules", []) or [])


# ------------------------------------------------------------------------------ run
def flatten(value) -> list[np.ndarray]:
    """A VM result (tensor or nested tuples of tensors) as a flat list of arrays, in order.

    A `None` (a Relax null value: a model output that is None) holds no array.
    """
    if value is None:
        return []
    if hasattr(value, "numpy"):
        return [value.numpy()]
    flat: list[np.ndarray] = []
    for item in value:
        flat.extend(flatten(item))
    return flat


class Runner:
    """Builds units for one target and runs them on a local device or over TVM RPC.

    The device (and the RPC session) is opened on first use; `reset` forgets it, so the next
    unit reconnects. Exported libraries are loaded once per path until then.
    """

    def __init__(self, target: str | None, rpc: str | None = None, tracker: str | None = None,
                 key: str | None = None, no_device_hint: str = NO_DEVICE_HINT, kernel_store: str | None = None):
        """`kernel_store`: a folder where kernels built at run time (the paged KV cache's) are kept for
        later processes (portable/paged_kv.py); None keeps them in this process only."""
        self.target_text = target or DEFAULT_TARGET
        self.target = parse_target(self.target_text)
        self.rpc, self.tracker, self.key = rpc, tracker, key
        self.no_device_hint = no_device_hint
        self.remote = None  # the RPC session, once connected
        self._device = None
        self._loaded: dict[str, object] = {}  # exported library path -> VirtualMachine
        self._entries: dict[int, str] = {}  # id of a loaded VirtualMachine -> its unit's entry
        self._tmp = None
        if not self.is_remote:
            register_paged_kv(kernel_store)  # a recorded paged-KV call runs here (portable/paged_kv.py)

    @property
    def where(self) -> str:
        return target_label(self.target_text, self.rpc, self.tracker, self.key)

    @property
    def is_remote(self) -> bool:
        return bool(self.rpc or self.tracker)

    def build(self, mod, transform=None):
        return build(mod, self.target, transform)

    def device(self):
        if self._device is None:
            kind = device_kind(self.target)
            if self.is_remote:
                self.remote = connect(self.rpc, self.tracker, self.key)
                self._device = self.remote.device(kind, 0)
            else:
                self._device = local_device(self.target.kind.name, self.no_device_hint)
        return self._device

    def alive(self) -> bool:
        """Whether the RPC session still answers (one round trip); a local device always does."""
        if self.remote is None:
            return not self.is_remote
        try:
            self.remote.get_function("runtime.GetDeviceAttr")
            return True
        except Exception:
            return False

    def reset(self) -> None:
        """Forget the device, the RPC session and every loaded library: the next unit reconnects."""
        self.remote = None
        self._device = None
        self._loaded.clear()
        self._entries.clear()

    def load(self, compiled, name: str = ENTRY):
        """A VirtualMachine on the device for an executable, or for an exported library's path.

        Over RPC the library is uploaded first (an executable is exported as `name`.so).
        """
        from tvm import relax

        if isinstance(compiled, (str, os.PathLike)):
            path = os.fspath(compiled)
            if path not in self._loaded:
                vm = relax.VirtualMachine(self._load_library(path), self.device())
                self._loaded[path] = vm
                self._entries[id(vm)] = _entry_of(vm, path)
            return self._loaded[path]
        device = self.device()
        if self.remote is None:
            return relax.VirtualMachine(compiled, device)
        path = os.path.join(self._scratch(), f"{name}.so")
        compiled.export_library(path)
        return relax.VirtualMachine(self._load_library(path), device)

    def _load_library(self, path: str):
        import tvm

        self.device()  # connects first, when remote
        if self.remote is None:
            return tvm.runtime.load_module(path)
        self.remote.upload(path)
        return self.remote.load_module(os.path.basename(path))

    def _scratch(self) -> str:
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="tapml_runner_")
            weakref.finalize(self, shutil.rmtree, self._tmp, True)
        return self._tmp

    def to_device(self, array):
        """On a local cpu amid random bytes (`guarded`): the allocator's repeat from run to run."""
        import tvm

        if not self.is_remote and device_kind(self.target) == "cpu":
            placed = guarded(array)
            if placed is not None:
                return tvm.runtime.from_dlpack(placed)
        return tvm.runtime.tensor(contiguous(array), self.device())

    def invoke(self, vm, args: list):
        """Call the unit's entry with `args` (numpy arrays or tensors already on the device); the raw result."""
        import tvm

        args = [arg if isinstance(arg, tvm.runtime.Tensor) else self.to_device(arg) for arg in args]
        entry = self._entries.get(id(vm), ENTRY)
        if self.remote is None:
            return vm[entry](*args)
        # over RPC a returned tuple stays on the remote side: use the stateful interface
        vm.set_input(entry, *args)
        vm.invoke_stateful(entry)
        return vm.get_outputs(entry)

    def run(self, vm, arrays: list) -> list[np.ndarray]:
        """The unit's outputs as one flat list of numpy arrays."""
        return flatten(self.invoke(vm, arrays))
