"""Shared machinery of tapml-dbg repros and carved suites; needs nothing but `tvm` and `numpy`.

This file is `tapml_dbg/repro/standalone.py` in tapml-dbg and is copied verbatim into every
dump and carve directory as `_tapml_repro_lib.py`, so `repro.py` and a carved `test_ops.py`
run the same code without tapml-dbg (or torch) installed. Keep it that way: standard library,
numpy and tvm only (ml_dtypes, a dependency of tvm, only for bfloat16/float8 data).

The directory it works on holds:
  meta.json   what to run: one entry per op (its TVMScript module, its input and output arrays,
              the tolerance of each output), the default target and the transform, if any
  data.npz    every array, plain numeric (no pickle); dtypes numpy lacks (bfloat16, float8)
              are stored as raw unsigned bits and decoded with the dtype named in meta.json
  modules     TVMScript text, parsed back with `tvm.script.from_source`
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import weakref
import zipfile

import numpy as np

FORMAT = "tapml-repro"
FORMAT_VERSION = 1
META_FILE = "meta.json"
DATA_FILE = "data.npz"
LIB_FILE = "_tapml_repro_lib.py"
COMPARE_RULE = ("an output passes when max_abs_err <= atol + rtol * absmax(source), both over finite "
                "elements, and the NaN/Inf pattern, the shape and the dtype match the source; integer "
                "and bool outputs must match exactly; outputs nothing in the model reads are reported, "
                "not judged")

# statuses of one op check; every one but "pass" means the op fails on the target
PASS, FAIL, COMPILE_ERROR, RUN_ERROR = "pass", "fail", "compile-error", "error"

# exit codes of repro.py
EXIT_OK, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2

_NATIVE_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                            "uint64", "float16", "float32", "float64"])
_BITS_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


class ReproBroken(Exception):
    """The repro itself cannot run (missing file, bad meta, bad arguments): not a verdict on the op."""


# ------------------------------------------------------------------------------ arrays
def _contiguous(array) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them shape (1,))."""
    return np.require(np.asarray(array), requirements="C")


def dtype_name(array) -> str:
    return str(np.asarray(array).dtype) if not hasattr(array, "dtype") else str(array.dtype)


def encode_array(array) -> tuple[np.ndarray, str]:
    """(array npz can hold without pickle, logical dtype name). bfloat16/float8 become raw bits."""
    array = _contiguous(array)
    name = dtype_name(array)
    if name in _NATIVE_DTYPES:
        return array, name
    bits = _BITS_OF_SIZE.get(array.dtype.itemsize)
    if bits is None:
        raise ValueError(f"cannot store dtype {name} in a repro")
    return array.view(bits), name


def decode_array(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Invert `encode_array`, bit exact."""
    if dtype_name(stored) == dtype:
        return stored
    if dtype in _NATIVE_DTYPES:
        raise ReproBroken(f"array stored as {dtype_name(stored)} but declared {dtype}; the data is corrupt")
    try:
        import ml_dtypes  # a dependency of tvm
    except ImportError as exc:
        raise ReproBroken(f"decoding {dtype} data needs the ml_dtypes package (pip install ml_dtypes)") from exc
    want = np.dtype(getattr(ml_dtypes, dtype))
    if stored.dtype.itemsize != want.itemsize:
        raise ReproBroken(f"array stored as {dtype_name(stored)} cannot hold {dtype}; the data is corrupt")
    return _contiguous(stored).view(want)


def write_npz(path: str, arrays) -> None:
    """Stream `(key, array)` pairs into an npz (what np.savez writes), one array in memory at a time."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays:
            with archive.open(key + ".npy", "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, _contiguous(array), allow_pickle=False)


def read_meta(here: str) -> dict:
    path = os.path.join(here, META_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ReproBroken(f"cannot read {path}: {exc}") from exc
    if meta.get("format") != FORMAT or int(meta.get("version", 0)) > FORMAT_VERSION:
        raise ReproBroken(f"{path} is not a {FORMAT} v{FORMAT_VERSION} file")
    return meta


class Data:
    """The arrays of a repro directory, loaded lazily from data.npz (never with pickle)."""

    def __init__(self, here: str):
        path = os.path.join(here, DATA_FILE)
        try:
            self._npz = np.load(path, allow_pickle=False)
        except OSError as exc:
            raise ReproBroken(f"cannot read {path}: {exc}") from exc

    def get(self, entry: dict) -> np.ndarray:
        key = entry["key"]
        try:
            stored = self._npz[key]
        except KeyError as exc:
            raise ReproBroken(f"array {key!r} is missing from {DATA_FILE}") from exc
        return decode_array(stored, entry["dtype"])

    def close(self) -> None:
        self._npz.close()


# ------------------------------------------------------------------------------ compare
def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


COMPARE_BLOCK = 1 << 20  # elements per block: the float64 temporaries stay ~10 x 8 MiB for any tensor


def _blocks(*flat: np.ndarray):
    """Aligned slices of 1-D arrays, COMPARE_BLOCK elements at a time: float64 copies of a block stay
    small, while a 40M-element tensor converted in one go needs GiBs."""
    for start in range(0, flat[0].size, COMPARE_BLOCK):
        yield tuple(array[start:start + COMPARE_BLOCK] for array in flat)


class _Cosine:
    """Cosine similarity accumulated over blocks."""

    def __init__(self):
        self.dot = self.aa = self.bb = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        self.dot += float(np.dot(a, b))
        self.aa += float(np.dot(a, a))
        self.bb += float(np.dot(b, b))

    def value(self) -> float:
        na, nb = math.sqrt(self.aa), math.sqrt(self.bb)
        if na == 0 and nb == 0:
            return 1.0
        if na == 0 or nb == 0:
            return 0.0
        return self.dot / (na * nb)


def compare(target: np.ndarray, source: np.ndarray, rtol: float, atol: float) -> dict:
    """Metrics of one target output against its recorded source value (the rule in COMPARE_RULE)."""
    with np.errstate(all="ignore"):
        return _compare(np.asarray(target), np.asarray(source), float(rtol), float(atol))


def _compare(target: np.ndarray, source: np.ndarray, rtol: float, atol: float) -> dict:
    m = {"max_abs_err": 0.0, "max_rel_err": 0.0, "scale_rel_err": 0.0, "cosine": 1.0, "nan_mismatch": 0,
         "inf_mismatch": 0, "shape_mismatch": "", "dtype_mismatch": "", "mismatched": 0,
         "numel": int(source.size), "passed": True, "rtol": rtol, "atol": atol, "bound": atol, "absmax": 0.0}
    if tuple(target.shape) != tuple(source.shape):
        m["shape_mismatch"] = f"{tuple(target.shape)} vs source {tuple(source.shape)}"
        m["passed"] = False
        return m
    if dtype_name(target) != dtype_name(source):
        m["dtype_mismatch"] = f"{dtype_name(target)} vs source {dtype_name(source)}"
        m["passed"] = False
        return m
    if source.size == 0:
        return m
    target, source = target.reshape(-1), source.reshape(-1)  # one copy at most, if not contiguous
    if not _is_float(dtype_name(source)):
        return _compare_exact(target, source, m)
    scale = 0.0  # pass 1: the source's largest finite magnitude sets the bound
    for (s_block,) in _blocks(source):
        s64 = s_block.astype(np.float64)
        scale = max(scale, float(np.max(np.abs(np.where(np.isfinite(s64), s64, 0.0)))))
    bound = atol + rtol * scale
    cosine = _Cosine()
    for t_block, s_block in _blocks(target, source):  # pass 2: every other figure
        t64, s64 = t_block.astype(np.float64), s_block.astype(np.float64)
        t_nan, s_nan = np.isnan(t64), np.isnan(s64)
        t_inf, s_inf = np.isinf(t64), np.isinf(s64)
        m["nan_mismatch"] += int(np.count_nonzero(t_nan != s_nan))
        same_inf = (t_inf & s_inf) & (np.sign(t64) == np.sign(s64))
        m["inf_mismatch"] += int(np.count_nonzero((t_inf | s_inf) & ~same_inf & ~(t_nan | s_nan)))
        finite = np.isfinite(t64) & np.isfinite(s64)
        diff = np.abs(np.where(finite, t64 - s64, 0.0))
        m["max_abs_err"] = max(m["max_abs_err"], float(np.max(diff)))
        significant = (np.abs(s64) > max(atol, 1e-30)) & finite
        if np.any(significant):
            m["max_rel_err"] = max(m["max_rel_err"], float(np.max(diff[significant] / np.abs(s64[significant]))))
        cosine.add(np.where(finite, t64, 0.0), np.where(finite, s64, 0.0))
        m["mismatched"] += int(np.count_nonzero(diff > bound))
    m["absmax"] = scale
    m["scale_rel_err"] = m["max_abs_err"] / scale if scale > 0 else (0.0 if m["max_abs_err"] == 0 else math.inf)
    m["cosine"] = cosine.value()
    if m["nan_mismatch"] or m["inf_mismatch"]:  # finite-only figures would look perfect
        m["cosine"] = math.nan
        m["max_abs_err"] = math.inf
    m["bound"] = bound
    m["mismatched"] += m["nan_mismatch"] + m["inf_mismatch"]
    m["passed"] = m["max_abs_err"] <= bound and not m["nan_mismatch"] and not m["inf_mismatch"]
    return m


def _compare_exact(target: np.ndarray, source: np.ndarray, m: dict) -> dict:
    """Integers and bools must match exactly; the float figures say by how much they do not."""
    m["bound"] = 0.0
    m["mismatched"] = int(np.count_nonzero(target != source))
    if m["mismatched"]:
        scale, cosine = 1.0, _Cosine()
        for t_block, s_block in _blocks(target, source):
            t64, s64 = t_block.astype(np.float64), s_block.astype(np.float64)
            m["max_abs_err"] = max(m["max_abs_err"], float(np.max(np.abs(t64 - s64))))
            scale = max(scale, float(np.max(np.abs(s64))))
            cosine.add(t64, s64)
        m["scale_rel_err"] = m["max_abs_err"] / scale
        m["cosine"] = cosine.value()
    m["passed"] = m["mismatched"] == 0
    return m


def format_metrics(m: dict) -> str:
    if m.get("shape_mismatch"):
        return f"shape {m['shape_mismatch']}"
    if m.get("dtype_mismatch"):
        return f"dtype {m['dtype_mismatch']}"
    text = (f"max_abs_err={_g(m['max_abs_err'])} (bound {_g(m['bound'])} = atol {_g(m['atol'])} + rtol "
            f"{_g(m['rtol'])} * absmax {_g(m['absmax'])}) scale_rel={_g(m['scale_rel_err'])} "
            f"max_rel={_g(m['max_rel_err'])} cos={m['cosine']:.6f}")
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        text += f" nan_mismatch={m['nan_mismatch']} inf_mismatch={m['inf_mismatch']}"
    return text + f" mismatched={m['mismatched']}/{m['numel']}"


def _g(value) -> str:
    return "nan" if value is None else f"{value:.3g}"


# ------------------------------------------------------------------------------ module, target, device
def load_module(path: str):
    """Parse an op's TVMScript file back into a tvm.IRModule."""
    import tvm
    import tvm.script

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ReproBroken(f"cannot read the op's module {path}: {exc}") from exc
    try:
        return tvm.script.from_source(text)
    except Exception as exc:
        raise ReproBroken(f"TVMScript in {path} does not parse with this TVM ({tvm.__version__}): "
                          f"{_one_line(exc)}") from exc


def load_transform(here: str, spec: dict | None):
    """The user's `FUNC(mod) -> mod` from the transform file copied into the directory."""
    if not spec:
        return None
    path = os.path.join(here, spec["file"])
    try:
        with open(path, "rb") as handle:
            digest = hashlib.sha256(os.path.abspath(path).encode() + b"\0" + handle.read()).hexdigest()[:16]
    except OSError as exc:
        raise ReproBroken(f"cannot read the transform {path}: {exc}") from exc
    name = f"_tapml_repro_transform_{digest}"  # one module per file version
    if name in sys.modules:
        module = sys.modules[name]
    else:
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise ReproBroken(f"cannot import the transform {path}")
        module = importlib.util.module_from_spec(loader)
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:  # sibling imports work as when tapml-dbg loaded it
            sys.path.insert(0, folder)
        try:
            loader.loader.exec_module(module)
        except Exception as exc:
            raise ReproBroken(f"importing the transform {path} failed: {_one_line(exc)}") from exc
        sys.modules[name] = module
    func = getattr(module, spec["func"], None)
    if not callable(func):
        raise ReproBroken(f"the transform {path} has no function {spec['func']!r}")
    return func


def parse_target(text: str):
    """A bare kind (`cuda`), a TVM target string, or a JSON dict such as {"kind":"cuda"}."""
    import tvm

    text = (text or "llvm").strip()
    try:
        return tvm.target.Target(json.loads(text) if text.startswith("{") else text)
    except Exception as exc:
        raise ReproBroken(f"invalid target {text!r}: {_one_line(exc)}") from exc


def device_kind(target) -> str:
    kind = target.kind.name
    return "cpu" if kind in ("llvm", "c") else kind


def split_host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = (text or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ReproBroken(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


class Runner:
    """Compiles a module for one target and runs it on a local device or over TVM RPC."""

    def __init__(self, target: str, rpc: str | None = None, tracker: str | None = None, key: str | None = None):
        self.target_text = target
        self.target = parse_target(target)
        self.rpc, self.tracker, self.key = rpc, tracker, key
        self._remote = None
        self._device = None
        self._tmp = None

    @property
    def where(self) -> str:
        if self.rpc:
            return f"{self.target_text} over RPC {self.rpc}"
        if self.tracker:
            return f"{self.target_text} from tracker {self.tracker} key {self.key}"
        return f"{self.target_text} (local {device_kind(self.target)})"

    def device(self):
        if self._device is None:
            import tvm

            kind = device_kind(self.target)
            if self.rpc or self.tracker:
                from tvm import rpc

                try:
                    if self.rpc:
                        self._remote = rpc.connect(*split_host_port(self.rpc, "--rpc"))
                    else:
                        if not self.key:
                            raise ReproBroken("--tracker needs --key KEY")
                        client = rpc.connect_tracker(*split_host_port(self.tracker, "--tracker"))
                        self._remote = client.request(self.key, priority=1)
                except ReproBroken:
                    raise
                except Exception as exc:
                    raise ReproBroken(f"cannot reach the RPC endpoint {self.rpc or self.tracker}: "
                                      f"{_one_line(exc)}") from exc
                self._device = self._remote.device(kind, 0)
            else:
                device = tvm.device(kind, 0)
                if not device.exist:
                    raise ReproBroken(f"no {kind} device on this machine (use --target, or --rpc HOST:PORT "
                                      "for a remote device)")
                self._device = device
        return self._device

    def compile(self, mod, transform=None):
        import tvm

        if transform is not None:
            mod = transform(mod)
            if mod is None or not hasattr(mod, "functions_items"):
                raise TypeError(f"the transform must return a tvm.IRModule, got {type(mod).__name__}")
        return tvm.compile(mod, self.target)

    def load(self, executable, name: str):
        """A VirtualMachine for a compiled executable on this runner's device."""
        import tvm
        from tvm import relax

        device = self.device()
        if self._remote is None:
            return relax.VirtualMachine(executable, device)
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="tapml_repro_")
            weakref.finalize(self, shutil.rmtree, self._tmp, True)
        path = os.path.join(self._tmp, f"{name}.so")
        executable.export_library(path)
        self._remote.upload(path)
        return relax.VirtualMachine(self._remote.load_module(os.path.basename(path)), device)

    def run(self, vm, arrays: list[np.ndarray]) -> list[np.ndarray]:
        import tvm

        device = self.device()
        args = [tvm.runtime.tensor(_contiguous(a), device) for a in arrays]
        if self._remote is None:
            return flatten(vm["main"](*args))
        # over RPC a returned tuple stays on the remote side: use the stateful interface
        vm.set_input("main", *args)
        vm.invoke_stateful("main")
        return flatten(vm.get_outputs("main"))


def flatten(value) -> list[np.ndarray]:
    """A VM result (tensor or nested tuples of tensors) as a flat list of arrays, in order."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    flat: list[np.ndarray] = []
    for item in value:
        flat.extend(flatten(item))
    return flat


# ------------------------------------------------------------------------------ one op
class OpCheck:
    """The outcome of running one op on the target: status, per-output metrics, message."""

    def __init__(self, op: dict, where: str, status: str, metrics=None, message: str = "", outputs=None):
        self.op, self.where, self.status = op, where, status
        self.metrics = metrics or []
        self.message = message
        self.outputs = outputs or []  # the target's outputs, when it ran

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def lines(self) -> list[str]:
        op = self.op
        head = (f"op #{op['index']} {op['name']} ({op['op']}"
                + (f", layer {op['layer']}" if op.get("layer") else "") + f") on {self.where}: {self.status}")
        lines = [head]
        if self.message:
            lines.append("  " + self.message)
        for number, (out, m) in enumerate(zip(op["outputs"], self.metrics)):
            verdict = "ok  " if m["passed"] else "FAIL"
            if not out.get("judged", True):
                verdict = "not judged (nothing in the model reads it), " + ("ok" if m["passed"] else "differs") + ":"
            lines.append(f"  out {number} {out['dtype']} {tuple(out['shape'])}: {verdict} {format_metrics(m)}")
        return lines

    def report(self) -> str:
        return "\n".join(self.lines())


def op_id(op: dict) -> str:
    return f"{op['index']:03d}-{op['name']}"


def check_op(here: str, meta: dict, op: dict, runner: Runner, data: Data) -> OpCheck:
    """Build the op's module, compile it for the target, run it on the recorded inputs, compare.

    Raises ReproBroken when the repro itself cannot run; a compile or run failure on the
    target is a status, as is a divergence.
    """
    mod = load_module(os.path.join(here, op["module"]))
    transform = load_transform(here, meta.get("transform"))
    inputs = [data.get(entry) for entry in op["inputs"]]
    expected = [data.get(entry) for entry in op["outputs"]]
    try:
        executable = runner.compile(mod, transform)
    except Exception as exc:
        missing = _unset_env(meta)
        if missing and transform is not None:
            raise ReproBroken(f"the transform failed ({_one_line(exc)}); it reads environment variables "
                              f"that are not set: {', '.join(missing)} (README.md lists the values the dump "
                              "used)") from exc
        return OpCheck(op, runner.where, COMPILE_ERROR, message=_one_line(exc))
    try:
        vm = runner.load(executable, f"tapml_op_{op['index']}")
        outputs = runner.run(vm, inputs)
    except ReproBroken:
        raise
    except Exception as exc:
        return OpCheck(op, runner.where, RUN_ERROR, message=_one_line(exc))
    if len(outputs) != len(expected):
        return OpCheck(op, runner.where, FAIL, message=f"{len(outputs)} outputs vs {len(expected)} recorded",
                       outputs=outputs)
    metrics = [compare(t, s, out["rtol"], out["atol"]) for t, s, out in zip(outputs, expected, op["outputs"])]
    judged = [m for m, out in zip(metrics, op["outputs"]) if out.get("judged", True)]
    return OpCheck(op, runner.where, PASS if all(m["passed"] for m in judged) else FAIL, metrics,
                   outputs=outputs)


def _unset_env(meta: dict) -> list[str]:
    used = (meta.get("transform") or {}).get("env", {})
    return [name for name, value in used.items() if value is not None and name not in os.environ]


def _one_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:500]


# ------------------------------------------------------------------------------ repro.py
def parse_args(argv, meta: dict) -> argparse.Namespace:
    op = meta["ops"][0]
    parser = argparse.ArgumentParser(
        prog="repro.py", description=f"Reproduce op #{op['index']} {op['name']} ({op['op']}) of "
                                     f"{meta.get('model', 'the model')} with tvm and numpy only.",
        epilog="exit status: 1 the divergence reproduces (or the op fails to compile or run), 0 it does "
               "not, 2 the repro itself cannot run")
    parser.add_argument("--target", default=meta.get("target", "llvm"),
                        help=f"TVM target (default: the dump's, {meta.get('target', 'llvm')})")
    remote = parser.add_mutually_exclusive_group()
    remote.add_argument("--rpc", metavar="HOST:PORT", help="run on a TVM RPC server")
    remote.add_argument("--tracker", metavar="HOST:PORT", help="lease a device from a TVM RPC tracker")
    parser.add_argument("--key", help="device key at the tracker")
    parser.add_argument("--save-outputs", metavar="FILE.npz", help="also save the target's outputs")
    return parser.parse_args(argv)


def repro_main(here: str, argv=None, out=None) -> int:
    """What repro.py runs: returns the exit status, writes the report to `out` (default stdout)."""
    out = out or sys.stdout
    try:
        meta = read_meta(here)
        args = parse_args(argv, meta)
        runner = Runner(args.target, args.rpc, args.tracker, args.key)
        data = Data(here)
        op = meta["ops"][0]
        check = check_op(here, meta, op, runner, data)
    except ReproBroken as exc:
        out.write(f"repro cannot run: {exc}\n")
        return EXIT_BROKEN
    out.write(f"tapml-dbg repro of {meta.get('model', '?')} (recorded on {meta.get('source', '?')})\n")
    if meta.get("transform"):
        out.write(f"transform: {meta['transform']['file']}:{meta['transform']['func']}\n")
        for name, value in (meta["transform"].get("env") or {}).items():
            if value is not None and os.environ.get(name) != value:
                now = "unset" if name not in os.environ else f"{os.environ[name]!r}"
                out.write(f"note: the transform reads ${name}, which was {value!r} when the repro was made and "
                          f"is {now} now\n")
    out.write(check.report() + "\n")
    if args.save_outputs and check.outputs:
        write_npz(args.save_outputs, ((f"out/{k}", encode_array(a)[0]) for k, a in enumerate(check.outputs)))
        out.write(f"target outputs saved to {args.save_outputs} (keys out/0.., raw bits for bfloat16)\n")
    if check.passed:
        out.write(f"NOT REPRODUCED: op #{op['index']} {op['name']} matches the source on {runner.where}\n")
        return EXIT_OK
    out.write(f"REPRODUCED: op #{op['index']} {op['name']} diverges on {runner.where} ({check.status})\n")
    return EXIT_REPRODUCED
