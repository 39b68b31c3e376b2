"""The params a v1.4 trace reads from checkpoint files by reference (trace/weight_refs.py), as the
reader sees them: the references parsed on first use, the files opened only when a param is read."""

from __future__ import annotations

from tapml_dbg.trace import schema as S
from tapml_dbg.trace import validate as V
from tapml_dbg.trace import weight_refs as W
from tapml_dbg.trace.stats import tensor_stats
from tapml_dbg.trace.trace_file import TraceFile


class Weights:
    """A trace's referenced params (none before v1.4, or where the trace stores every param)."""

    def __init__(self, file: TraceFile):
        self._file = file
        self._refs: W.WeightRefs | None | bool = False  # False: not loaded yet
        self._stats: dict[str, dict] = {}

    @property
    def refs(self) -> W.WeightRefs | None:
        """The params this trace reads from checkpoint files (v1.4, trace/weight_refs.py); None when it
        stores every param itself. Opening the trace never opens those files."""
        if self._refs is False:
            file = self._file
            present = file.version >= S.WEIGHT_REFS_SINCE and file.has(S.DS_WEIGHT_REFS)
            part = f"/{S.DS_WEIGHT_REFS}"
            self._refs = W.WeightRefs(*file.guard(part, lambda: W.parse_refs(
                V.parse_json(file.text(S.DS_WEIGHT_REFS), part), f"{file.path}: {part}"))) if present else None
        return self._refs

    def require(self) -> None:
        """Raise the one-line error of a referenced checkpoint file that is missing or changed size (a
        replay needs them; `info` only lists them)."""
        if self.refs is not None:
            self.refs.require()

    def stats(self, name: str) -> dict:
        """A referenced param's stats, computed when asked (recording stays fast), once per reader."""
        if name not in self._stats:
            self._stats[name] = tensor_stats(self.refs.read(name))
        return self._stats[name]

    def close(self) -> None:
        if self._refs:
            self._refs.close()
