"""Load `path/to/file.py[:FUNC]` and check that FUNC returns `(nn.Module, tuple_of_inputs)`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tapml_dbg.errors import ModelError

DEFAULT_BUILD_FUNC = "build"


def split_model_spec(spec: str) -> tuple[Path, str]:
    """`file.py:func` → (path, func); a bare path means the default `build`."""
    path_text, sep, func = spec.rpartition(":")
    if not sep or not path_text.endswith(".py"):
        path_text, func = spec, DEFAULT_BUILD_FUNC
    return Path(path_text), func or DEFAULT_BUILD_FUNC


def load_python_function(spec: str, what: str = "model"):
    """Import FILE.py and return FUNC from it, with errors that say what to fix."""
    path, func_name = split_model_spec(spec)
    if not path.is_file():
        raise ModelError(f"{what} file not found: {path} (give a path to a .py file, as FILE.py[:FUNC])")
    module_name = f"_tapml_user_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # sibling imports work as when the file runs as a script
        sys.path.insert(0, folder)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed: say where, not a traceback
        raise ModelError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ModelError(f"{path} has no function {func_name!r} (name it as {path}:FUNC)")
    return func


def load_model(spec: str):
    """Call the model's build function; return `(module, inputs)` with inputs a tuple of tensors."""
    import torch

    build = load_python_function(spec)
    try:
        result = build()
    except Exception as exc:
        raise ModelError(f"{spec}: build function raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelError(f"{spec}: build function must return (torch.nn.Module, tuple_of_inputs), "
                         f"got {type(result).__name__}")
    module, inputs = result
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{spec}: first returned value must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ModelError(f"{spec}: second returned value must be a tuple of torch.Tensor inputs")
    return module.eval(), tuple(inputs)
