"""Load `path/to/file.py[:FUNC]` and check that FUNC returns `(nn.Module, tuple_of_inputs)`."""

from __future__ import annotations

import traceback
from pathlib import Path

from tapml_dbg.errors import ModelError
from tapml_dbg.portable import DEFAULT_FUNC, PortableError, load_function, require_file, split_spec

DEFAULT_BUILD_FUNC = DEFAULT_FUNC  # `FILE.py` alone means `FILE.py:build`


def split_model_spec(spec: str) -> tuple[Path, str]:
    """`file.py:func` → (path, func); a bare path means the default `build`."""
    path, func = split_spec(spec, DEFAULT_BUILD_FUNC)
    return Path(path), func


def check_model_file(spec: str, what: str = "model") -> None:
    """The spec's FILE.py exists: checked before torch is imported, so that a typo fails at once."""
    try:
        require_file(str(split_model_spec(spec)[0]), what)
    except PortableError as exc:
        raise ModelError(str(exc)) from exc


def load_python_function(spec: str, what: str = "model"):
    """Import FILE.py and return FUNC from it, with errors that say what to fix.

    The loading is portable's (the one loader, which repros run too); its errors become ModelError.
    """
    path, func_name = split_model_spec(spec)
    try:
        return load_function(str(path), func_name, what=what)
    except PortableError as exc:
        raise ModelError(str(exc)) from exc


def load_model(spec: str):
    """Call the model's build function; return `(module, inputs)` with inputs a tuple of tensors."""
    import torch

    build = load_python_function(spec)
    try:
        result = build()
    except Exception as exc:  # where in the user's file it raised: the deepest frame of that file
        model_file = split_model_spec(spec)[0].resolve()
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == model_file]
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        raise ModelError(f"{spec}: build function raised {type(exc).__name__}: {exc}{where}") from exc
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
