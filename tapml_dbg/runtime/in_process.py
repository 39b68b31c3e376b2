"""Run units in this process on the host CPU (llvm): the recorder's way to fill in helper ops.

It compiles through the same cache and runs through the same portable `Runner` as the target
worker, only without the child process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.model.units import build_unit
from tapml_dbg.portable import Runner, flatten
from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR, compile_unit, kernel_store
from tapml_dbg.runtime.target import DEFAULT_TARGET


class LocalRunner:
    """Compile-and-run one unit at a time for a host target, caching compiled units."""

    def __init__(self, main, target: str = DEFAULT_TARGET, cache_dir: Path = DEFAULT_CACHE_DIR):
        self.main = main
        self.target = target
        self.cache_dir = Path(cache_dir)
        self.runner = Runner(target, kernel_store=kernel_store(self.cache_dir))  # loads each compiled library once

    def run_ops(self, op_names: list[str], values: dict[str, list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Compute `op_names` (a contiguous chain) from `values` (name → flattened outputs)."""
        func, spec = build_unit(self.main, op_names, op_names)
        compiled = compile_unit(function_to_json(func), self.target, None, self.cache_dir)
        vm = self.runner.load(compiled.path)
        args = [values[name][max(index, 0)] for name, index in spec.inputs]
        return [flatten(item) for item in self.runner.invoke(vm, args)]
