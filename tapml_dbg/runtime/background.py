"""Work beside the caller, on a thread of the runtime's own.

The engine says what runs beside what (a search's chain beside its sweep, compiles ahead of a
chain); only runtime/ starts threads (DESIGN.md, "Architecture"). `Background` holds one such piece of
work: whether it is still running, its value once it is done, its error raised again where it is
collected. `StopFlag` is how the caller asks work it started to start nothing more.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
StopFlag = threading.Event  # set: the work it was handed starts no more units


class Background(Generic[T]):
    """`work()` on a daemon thread, started at once."""

    def __init__(self, work: Callable[[], T], name: str, stop: StopFlag | None = None):
        """`stop`: the flag the work reads to start no more units (`cancel` sets it)."""
        self.stop = stop if stop is not None else StopFlag()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], T]) -> None:
        try:
            self._value = work()
            self._finished = True
        except BaseException as exc:  # noqa: BLE001 - raised again by `result`, in the caller's thread
            self._error = exc

    def cancel(self) -> None:
        """Ask the work to start nothing more (what it started finishes)."""
        self.stop.set()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """The work returned a value (not: it is still running, or it raised)."""
        return self._finished

    @property
    def value(self) -> T | None:
        """Its value once `finished` (None before)."""
        return self._value

    def join(self) -> None:
        self._thread.join()

    def result(self) -> T:
        """Wait for the work; its value, or its error raised here."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._value
