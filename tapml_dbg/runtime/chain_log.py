"""What a screening chain has settled so far: written by its worker unit by unit, read by the session meanwhile.

A line per unit the chain ran, `NAME 1` when its value cleared the isolated screen as well as the
chain's own (`ChainScreen.isolated_rule`), else `NAME 0`; one `write` each, whole. A bisect's
sweep of isolated verdicts follows it (engine/search.py): an op the chain already cleared by the
isolated rule is not run alone, and no op is run alone before the chain has been past it, so on a
model whose per-op values are right the sweep's core has nothing to do (GPT-2 124M on llvm: every
one of the chain's values clears the isolated screen; docs/perf.md).
"""

from __future__ import annotations

import os
import threading

from tapml_dbg.runtime.appended import AppendedLines


class ChainLogWriter:
    """The worker's side: appended to as the chain goes ("": nothing is written)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND) if path else None

    def write(self, name: str, cleared: bool) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, f"{name} {int(cleared)}\n".encode())
            except OSError:  # the session is gone or its folder too: the sweep then runs every op
                self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ChainLog:
    """The session's side: the ops a chain has run (`reached`) and those it cleared by the isolated
    screen (`cleared`), read anew by `refresh`. Every chain of the session appends to one file."""

    def __init__(self, path: str):
        self.path = path
        self._lines = AppendedLines(path)
        self.reached: set[str] = set()
        self.cleared: set[str] = set()
        # a search's sweep reads it from the caller's thread while the overlap policy's chain thread reads
        # what the sweep has left (runtime/overlap.py): one reader at a time, or both read the same lines
        # and the offset moves on twice, past lines written after them
        self._reading = threading.Lock()

    def refresh(self) -> None:
        with self._reading:
            for line in self._lines.new():
                name, _space, flag = line.rpartition(" ")
                if name:
                    self.reached.add(name)
                    if flag == "1":
                        self.cleared.add(name)
