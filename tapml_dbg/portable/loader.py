"""Load FUNC from a user's FILE.py: a transform (`FILE.py:FUNC`) or a model's build function.

The one loader of user code: the engine's model loader and compile cache and a repro's copied
transform all go through `load_function`, so a file that loads in tapml-dbg loads in its repro.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys

from .errors import PortableError, TransformFailed, one_line, raised_in, shown_path

DEFAULT_FUNC = "build"  # FUNC of a bare FILE.py
SPEC_SEPARATOR = ":"
PYTHON_SUFFIX = ".py"
MODULE_PREFIX = "_tapml_user_"  # sys.modules name of a loaded file: prefix + digest of path and text
DIGEST_CHARS = 16


def split_spec(spec: str, default_func: str = DEFAULT_FUNC) -> tuple[str, str]:
    """`FILE.py:FUNC` -> (FILE.py, FUNC); a bare path (or one whose colon belongs to it) means `default_func`."""
    path, sep, func = spec.rpartition(SPEC_SEPARATOR)
    if not sep or not path.endswith(PYTHON_SUFFIX):
        path, func = spec, default_func
    return path, func or default_func


def require_file(path: str, what: str = "file") -> None:
    """Raise unless `path` is a file: what `load_function` checks first, and what a caller checks
    before it imports anything heavy (`record` fails in a blink on a typo, not after torch loads)."""
    if not os.path.isfile(path):
        raise PortableError(f"{what} file not found: {path} (give a path to a .py file, as FILE.py[:FUNC])")


def load_function(path: str, func: str, what: str = "file"):
    """Import `path` (once per version of its text) and return its callable `func`.

    The file's folder goes on sys.path, so sibling imports work as when it runs as a script.
    """
    path = os.fspath(path)
    require_file(path, what)
    try:
        with open(path, "rb") as handle:
            text = handle.read()
    except OSError as exc:
        raise PortableError(f"cannot read {path}: {exc}") from exc
    digest = hashlib.sha256(os.path.abspath(path).encode() + b"\0" + text).hexdigest()[:DIGEST_CHARS]
    name = MODULE_PREFIX + digest
    module = sys.modules.get(name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise PortableError(f"cannot import {path}: not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file failed: say where, not a traceback
            del sys.modules[name]
            raise PortableError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, func, None)
    if not callable(function):
        raise PortableError(f"{path} has no function {func!r} (name it as {path}:FUNC)")
    return function


def apply_transform(transform, mod):
    """`transform(mod)`, the user's pass: an exception raised inside it is the pass's failure
    (TransformFailed naming the pass and its own line), never the op's compile error; it must return
    an IRModule."""
    code = getattr(transform, "__code__", None)
    name = f"{shown_path(code.co_filename)}:{transform.__name__}" if code is not None else repr(transform)
    try:
        result = transform(mod)
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises is theirs to see
        where = raised_in(exc, code.co_filename) if code is not None else ""
        raise TransformFailed(f"the transform {name} raised" + (f" at {where}" if where else "") +
                              f": {one_line(exc)} (a bug in the pass, not a compile error of the op: fix the pass "
                              "and run again)") from exc
    if result is None or not hasattr(result, "functions_items"):
        raise TransformFailed(f"the transform {name} must return a tvm.IRModule, got {type(result).__name__}")
    return result
