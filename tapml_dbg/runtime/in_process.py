"""Run units in this process on the host CPU (llvm): the recorder's way to fill in helper ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR, compile_unit
from tapml_dbg.model.units import build_unit
from tapml_dbg.runtime.worker import flatten_value


class LocalRunner:
    """Compile-and-run one unit at a time for a host target, caching compiled units."""

    def __init__(self, main, target: str = "llvm", cache_dir: Path = DEFAULT_CACHE_DIR):
        self.main = main
        self.target = target
        self.cache_dir = Path(cache_dir)
        self._vms: dict[str, object] = {}

    def run_ops(self, op_names: list[str], values: dict[str, list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Compute `op_names` (a contiguous chain) from `values` (name → flattened outputs)."""
        import tvm
        from tvm import relax

        func, spec = build_unit(self.main, op_names, op_names)
        unit_json = function_to_json(func)
        compiled = compile_unit(unit_json, self.target, None, self.cache_dir)
        key = str(compiled.path)
        if key not in self._vms:
            self._vms[key] = relax.VirtualMachine(tvm.runtime.load_module(key), tvm.cpu())
        args = [tvm.runtime.tensor(np.require(values[name][max(index, 0)], requirements="C"), tvm.cpu())
                for name, index in spec.inputs]
        result = self._vms[key]["main"](*args)
        return [flatten_value(item) for item in result]
