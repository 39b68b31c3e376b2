"""Values a worker will read soon, read by a helper thread only while the worker waits for something else.

A chain of per-op kernels reads, op after op, the recorded value it screens each op against and
the params it feeds; on a GPU that is most of an op's cost, and the chain also waits, now and then,
for a unit a compile lane is building (an NVRTC build is a second or more). Reads done during those
waits are free. The helper reads only while the worker says it waits (`meanwhile`): outside them
both would want the interpreter lock, and the worker's next kernel would wait for the helper's
Python. h5py and TVM both release that lock in their long calls, so the two overlap.

A read that fails (a corrupt value) is dropped: the worker reads it again itself and reports the
error where it always did. A value the worker asks for before the helper got to it is read by the
worker, and the helper skips it. The values read ahead and not yet taken stay under `max_bytes`.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Callable, Hashable, Iterable

from tapml_dbg.trace.recent import values_nbytes


class ReadAhead:
    """`plan()`: the (key, read) pairs still to come, in the order the worker will want them, asked
    for by the helper at the worker's first wait (a worker that never waits pays nothing; `plan`
    runs beside the worker, so it only looks things up); `take(key)` hands over a value read ahead
    (None: read it yourself)."""

    def __init__(self, plan: Callable[[], Iterable[tuple[Hashable, Callable[[], object]]]], max_bytes: int):
        self.max_bytes = max_bytes
        self._plan = plan
        self._pending: deque = deque()
        self._ready: dict = {}
        self._bytes = 0
        self._skip: set = set()  # taken (or asked for) before they were read: not read, or dropped
        self._waiting = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.read_ahead = 0  # values read by the helper (how many the worker was spared)

    @contextmanager
    def meanwhile(self):
        """The worker waits (a build, a lock) while inside: the helper reads."""
        with self._changed:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="tapml-read-ahead", daemon=True)
                self._thread.start()
            self._waiting = True
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._waiting = False

    def take(self, key: Hashable):
        with self._changed:
            if key in self._ready:
                value = self._ready.pop(key)
                self._bytes -= _size(value)
                self._changed.notify_all()
                return value
            self._skip.add(key)
            return None

    def close(self) -> None:
        """Stop reading and let go of what was read (the helper stops after the read it is in)."""
        with self._changed:
            self._closed = True
            self._pending.clear()
            self._ready.clear()
            self._bytes = 0
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            reads = deque(self._plan())
        except Exception:  # no plan, no reading ahead: the worker reads everything itself
            return
        with self._changed:
            self._pending = reads
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or not self._pending
                                       or (self._waiting and self._bytes < self.max_bytes))
                if self._closed or not self._pending:
                    return
                key, read = self._pending.popleft()
                if key in self._skip or key in self._ready:
                    continue
            try:
                value = read()
            except Exception:  # the worker reads it again and says what is wrong
                continue
            with self._changed:
                if value is None or self._closed or key in self._skip:
                    continue
                self._ready[key] = value
                self._bytes += _size(value)
                self.read_ahead += 1



def _size(value) -> int:
    """An op's values (a list) or a param (one array)."""
    return values_nbytes(value if isinstance(value, list) else [value])
