"""Work beside the caller, on a thread of the runtime's own.

The engine says what it wants run (a search's chain and its sweep, compiles ahead of a chain); what
runs beside what is the runtime's (runtime/overlap.py, runtime/scheduler.py), and only runtime/
starts threads (DESIGN.md, "Architecture"). `Background` holds one such piece of
work: whether it is still running, its value once it is done, its error raised again where it is
collected. `Stream` holds a series made beside the caller, handed over in order when the caller
takes it. `StopFlag` is how the caller asks work it started to start nothing more.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Generic, Iterable, Iterator, TypeVar

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


class Stream(Generic[T]):
    """The items of `produce()` made on a daemon thread while the caller does other work, and handed
    over in order when the caller iterates. The thread waits while the items not taken yet weigh
    `budget` or more (`weight(item)`; one item always fits): a long series keeps a bounded part of
    its values waiting, and goes on as the caller takes them."""

    def __init__(self, produce: Callable[[], Iterable[T]], name: str, budget: int, weight: Callable[[T], int],
                 stop: StopFlag | None = None):
        """`stop`: the flag the work reads to start no more units (`cancel` sets it)."""
        self.stop = stop if stop is not None else StopFlag()
        self._budget, self._weight = budget, weight
        self._items: collections.deque = collections.deque()
        self._held = 0
        self._done = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)
        self._thread.start()

    def _run(self, produce: Callable[[], Iterable[T]]) -> None:
        try:
            for item in produce():
                weight = self._weight(item)
                with self._changed:
                    while self._items and self._held + weight > self._budget and not self.stop.is_set():
                        self._changed.wait()
                    if self.stop.is_set():
                        return
                    self._items.append((item, weight))
                    self._held += weight
                    self._changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - raised again where the caller takes the items
            self._error = exc
        finally:
            with self._changed:
                self._done = True
                self._changed.notify_all()

    def __iter__(self) -> Iterator[T]:
        """The items in order, each as soon as it is made; the work's error raised here after the
        items made before it."""
        while True:
            with self._changed:
                while not self._items and not self._done:
                    self._changed.wait()
                if not self._items:
                    if self._error is not None:
                        raise self._error
                    return
                item, weight = self._items.popleft()
                self._held -= weight
                self._changed.notify_all()
            yield item

    @property
    def done(self) -> bool:
        """The work has made its last item (or raised, or stopped)."""
        return self._done

    def cancel(self) -> None:
        """Ask the work to make nothing more (an item it is making is dropped)."""
        self.stop.set()
        with self._changed:
            self._changed.notify_all()

    def join(self) -> None:
        self._thread.join()
