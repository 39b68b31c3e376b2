"""Compile a unit for a target, through an on-disk cache keyed by unit, target, TVM and transform.

The build itself is portable's (`tapml_dbg.portable.build`, what `Runner.build` and every repro
run): the target's default Relax pipeline, then the device-code check, so the engine and a repro
can never disagree about whether a unit compiles. A unit that fails the check raises before it
is exported, so the cache holds only units that passed it.

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

from tapml_dbg import portable
from tapml_dbg.errors import UsageError
from tapml_dbg.model.serialize import function_from_json
from tapml_dbg.runtime.target import parse_target

DEFAULT_CACHE_DIR = Path(os.environ.get("TAPML_CACHE_DIR", Path.home() / ".cache" / "tapml-dbg"))
KEY_CHARS = 32
DIGEST_CHARS = 16


@dataclass
class CompiledUnit:
    path: Path  # the exported library
    cached: bool


def cache_key(unit_json: dict, target: str, transform_digest: str) -> str:
    import tvm

    text = json.dumps({"unit": unit_json, "target": target, "tvm": tvm.__version__,
                       "transform": transform_digest}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def transform_digest(spec: str | None) -> str:
    """Hash of the transform file's text, so editing a pass invalidates its cached units."""
    if not spec:
        return ""
    path, func = portable.split_spec(spec)
    try:
        return hashlib.sha256(Path(path).read_bytes() + func.encode()).hexdigest()[:DIGEST_CHARS]
    except OSError:
        return spec


def compile_unit(unit_json: dict, target: str, transform: str | None, cache_dir: Path,
                 export_format: str = "so") -> CompiledUnit:
    """Compile (or fetch from cache) one unit; returns the exported library's path.

    Raises TargetError for a bad target string, PortableError for a broken transform or a unit
    without device code, and whatever TVM raises for any other compile failure.
    """
    key = cache_key(unit_json, target, transform_digest(transform))
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{key}.{export_format}"
    tvm_target = parse_target(target)
    if path.exists():
        return CompiledUnit(path, True)
    executable = _build(unit_json, tvm_target, transform)
    tmp = path.with_suffix(f".tmp{os.getpid()}.{export_format}")
    executable.export_library(str(tmp))
    os.replace(tmp, path)
    return CompiledUnit(path, False)


def compile_only(unit_json: dict, target: str, transform: str | None) -> None:
    """Generate code without a device (and without the cache); raises as `compile_unit` does."""
    _build(unit_json, parse_target(target), transform)


def _build(unit_json: dict, target, transform: str | None):
    import tvm

    mod = tvm.IRModule({portable.ENTRY: function_from_json(unit_json)})
    return portable.build(mod, target, load_transform(transform))


def load_transform(spec: str | None):
    """The user's `FILE.py:FUNC` pass, through portable's loader (the one a repro uses).

    The loader keeps one module per version of the file's text, as the cache key does, so an
    edited pass is reloaded rather than applied stale under its new key.
    """
    if not spec:
        return None
    path, func = portable.split_spec(spec)
    try:
        return portable.load_function(path, func, what="transform")
    except portable.PortableError as exc:  # the user's file: a user error, one line
        raise UsageError(str(exc)) from exc
