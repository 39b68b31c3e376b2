"""Compile a unit for a target, through an on-disk cache keyed by unit, target, TVM and transform.

The cache stores exported shared libraries, so a second session (or a second probe of the same
range) loads machine code instead of recompiling. Runs inside the worker process: a codegen
segfault kills the worker, not the session.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE_DIR = Path(os.environ.get("TAPML_CACHE_DIR", Path.home() / ".cache" / "tapml-dbg"))


@dataclass
class CompiledUnit:
    path: Path  # the exported library
    cached: bool
    device_code: bool  # a device module exists (always True for CPU targets)


def cache_key(unit_json: dict, target: str, transform_digest: str) -> str:
    import tvm

    text = json.dumps({"unit": unit_json, "target": target, "tvm": tvm.__version__,
                       "transform": transform_digest}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def transform_digest(spec: str | None) -> str:
    """Hash of the transform file's text, so editing a pass invalidates its cached units."""
    if not spec:
        return ""
    from tapml_dbg.frontend.model_loader import split_model_spec

    path, func = split_model_spec(spec)
    try:
        return hashlib.sha256(path.read_bytes() + func.encode()).hexdigest()[:16]
    except OSError:
        return spec


def compile_unit(unit_json: dict, target: str, transform: str | None, cache_dir: Path,
                 export_format: str = "so") -> CompiledUnit:
    """Compile (or fetch from cache) one unit; returns the exported library's path."""
    import tvm

    from tapml_dbg.model.serialize import function_from_json
    from tapml_dbg.runtime.target import parse_target

    key = cache_key(unit_json, target, transform_digest(transform))
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{key}.{export_format}"
    tvm_target = parse_target(target)
    kind = tvm_target.kind.name
    if path.exists():
        return CompiledUnit(path, True, True)
    mod = tvm.IRModule({"main": function_from_json(unit_json)})
    if transform:
        mod = apply_transform(mod, transform)
    executable, device_code = _build(mod, tvm_target)
    tmp = path.with_suffix(f".tmp{os.getpid()}.{export_format}")
    executable.export_library(str(tmp))
    os.replace(tmp, path)
    return CompiledUnit(path, False, device_code)


def compile_only(unit_json: dict, target: str, transform: str | None) -> bool:
    """Generate code without a device; returns whether device code was produced."""
    import tvm

    from tapml_dbg.model.serialize import function_from_json
    from tapml_dbg.runtime.target import parse_target

    mod = tvm.IRModule({"main": function_from_json(unit_json)})
    if transform:
        mod = apply_transform(mod, transform)
    _, device_code = _build(mod, parse_target(target))
    return device_code


def _build(mod, target):
    """Lower with the target's default Relax pipeline (dlight schedules for GPUs), then build.

    Returns the executable and whether device code exists where kernels need it: a unit of
    view-like ops has no kernel at all, but a kernel compiled to host code only for a GPU
    target (an unscheduled PrimFunc) is a compile error, not a pass.
    """
    import tvm
    from tvm import relax

    with target:
        lowered = relax.get_default_pipeline(target)(mod)
    kernels = [gv for gv, func in lowered.functions_items() if isinstance(func, tvm.tirx.PrimFunc)]
    executable = tvm.compile(lowered, target, relax_pipeline=None)
    host = target.kind.name in ("llvm", "c")
    return executable, host or not kernels or _has_device_module(executable)


def _has_device_module(executable) -> bool:
    module = getattr(executable, "mod", executable)
    stack = list(getattr(module, "imports", None) or getattr(module, "imported_modules", []) or [])
    while stack:
        sub = stack.pop()
        kind = getattr(sub, "kind", None) or getattr(sub, "type_key", "")
        if kind and kind not in ("llvm", "c", "static_library", "library"):
            return True
        stack.extend(getattr(sub, "imports", None) or getattr(sub, "imported_modules", []) or [])
    return False


_TRANSFORMS: dict[str, object] = {}


def apply_transform(mod, spec: str):
    """Apply the user's `FILE.py:FUNC` pass; a broken pass is reported, not crashed on."""
    from tapml_dbg.errors import UsageError
    from tapml_dbg.frontend.model_loader import load_python_function

    if spec not in _TRANSFORMS:
        _TRANSFORMS[spec] = load_python_function(spec, what="transform")
    result = _TRANSFORMS[spec](mod)
    if result is None or not hasattr(result, "functions_items"):
        raise UsageError(f"transform {spec} must return a tvm.IRModule, got {type(result).__name__}")
    return result
