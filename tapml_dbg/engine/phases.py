"""The search's phases as pure decisions: given what is known so far, which units next, and what was found.

Nothing here runs a unit, starts a thread or waits: a phase is asked "which next?" and told what came
back (Polygraphy's `BisectMarker` is such an object; TVM keeps its passes apart from their context the
same way). engine/search.py's `Bisection` drives them over the runtime; tests/test_phases.py checks
each without a worker or a compile.

- `PrefixSearch`: the binary search over fused prefixes [first, k] (phase 2), one or several probes a
  round (`first_failing`, `first_failing_speculative`).
- `follow_chain`: which ops a sweep that follows the per-op chain settles, runs, or leaves waiting
  (phase 4 beside phase 1: `isolated.ChainLead`).
- `search_range`: the ops a search covers, from the trace's capture and recorded ops.
- `is_fusion_question`: whether a propagated culprit is a question for the fused diagnosis (phase 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Container, Sequence


@dataclass
class SearchTrace:
    """The probes a search made, in order, as (index, failed)."""

    probes: list[tuple[int, bool]] = field(default_factory=list)


_TOP, _RANGE, _DONE = "top", "range", "done"  # is anything wrong at all? / halving (good, bad] / answered


class PrefixSearch:
    """The smallest k in [lo, hi] whose probe fails, assuming failures persist once they start: the
    probe of `hi` first (is anything wrong at all?), then halving, so 1 + ceil(log2(n)) probes.

    Pure: `next(width)` says which points to probe (up to `width` a round, the first not-yet-known
    points of the decision tree breadth first from where the search stands, "failed" branch first);
    `record` takes their outcomes. Whatever the width, the answer and the probe path (`trace`) are
    the ones of one probe a round; a probe off the path is wasted work, at most `width - 1` a round.
    When failures do not persist the answer is still a transition point: k fails and k - 1 does not
    (or k == lo)."""

    def __init__(self, lo: int, hi: int, trace: SearchTrace | None = None):
        self.lo, self.hi = lo, hi
        self.trace = trace if trace is not None else SearchTrace()
        self.known: dict[int, bool] = {}
        self._state: tuple = (_TOP, None, None) if hi >= lo else (_DONE, None, None)

    @property
    def done(self) -> bool:
        return self._point(self._state) is None

    @property
    def answer(self) -> int | None:
        """The first failing prefix end (None: none fails, or the search is not done)."""
        return self._state[2] if self.done and self._state[0] == _RANGE else None

    def next(self, width: int = 1) -> list[int]:
        """The points to probe next ([] once the search is done)."""
        wanted: list[int] = []
        level = [self._state] if not self.done else []
        while level and len(wanted) < max(1, int(width)):
            below = []
            for node in level:
                k = self._point(node)
                if k is None:
                    continue
                if k in self.known:
                    below.append(self._follow(node, self.known[k]))
                elif len(wanted) < max(1, int(width)) and k not in wanted:
                    wanted.append(k)
                    below += [self._follow(node, True), self._follow(node, False)]
            level = below
        return wanted

    def record(self, points: Sequence[int], failed: Sequence[bool]) -> None:
        """The outcomes of probing `points`; the search walks its path as far as they go."""
        self.known.update((k, bool(f)) for k, f in zip(points, failed))
        point = self._point(self._state)
        while point is not None and point in self.known:
            self.trace.probes.append((point, self.known[point]))
            self._state = self._follow(self._state, self.known[point])
            point = self._point(self._state)

    def _point(self, state: tuple) -> int | None:  # None: the state is an answer
        if state[0] == _TOP:
            return self.hi
        if state[0] == _DONE:
            return None
        good, bad = state[1], state[2]  # failed(bad) is true; failed(good) false (or good < lo)
        return (good + bad) // 2 if bad - good > 1 else None

    def _follow(self, state: tuple, failed: bool) -> tuple:
        if state[0] == _TOP:
            return (_RANGE, self.lo - 1, self.hi) if failed else (_DONE, None, None)
        good, bad = state[1], state[2]
        middle = (good + bad) // 2
        return (_RANGE, good, middle) if failed else (_RANGE, middle, bad)


def first_failing(lo: int, hi: int, failed: Callable[[int], bool], trace: SearchTrace | None = None) -> int | None:
    """Smallest k in [lo, hi] with `failed(k)` (`PrefixSearch`, one probe at a time)."""
    search = PrefixSearch(lo, hi, trace)
    while points := search.next():
        search.record(points, [bool(failed(points[0]))])
    return search.answer


def first_failing_speculative(lo: int, hi: int, failed_many: Callable[[list[int]], list[bool]], width: int,
                              trace: SearchTrace | None = None) -> int | None:
    """`first_failing`'s answer and probe path, probing up to `width` points a round (`failed_many(ks)`:
    `failed(k)` for each k, e.g. computed side by side). With `width == 1` it makes the same calls."""
    search = PrefixSearch(lo, hi, trace)
    while points := search.next(width):
        search.record(points, failed_many(points))
    return search.answer


@dataclass(frozen=True)
class FollowStep:
    """What a sweep that follows the chain does now: `cleared`, ops settled without a run (their chained
    values cleared the isolated screen); `batches`, ops to run alone, a request each; `waiting`, ops the
    chain has not passed yet (asked again later)."""

    cleared: tuple[int, ...] = ()
    batches: tuple[tuple[int, ...], ...] = ()
    waiting: tuple[int, ...] = ()


def follow_chain(waiting: Sequence[int], name: Callable[[int], str], reached: Container[str],
                 cleared: Container[str], done: bool, cut: int | None, batch: int) -> FollowStep:
    """The ops of `waiting` the chain has been past, `batch` at a time (a chunk once the chain has passed
    all of it, so the requests are the same whatever the timing); ops above `cut` are not wanted any
    more. `done`: the chain has ended (what it did not reach is swept too)."""
    left = [index for index in waiting if cut is None or index <= cut]
    settled: list[int] = []
    batches: list[tuple[int, ...]] = []
    while left:
        chunk, rest = left[:batch], left[batch:]
        if not done and any(name(index) not in reached for index in chunk):
            break
        settled += [index for index in chunk if name(index) in cleared]
        run = tuple(index for index in chunk if name(index) not in cleared)
        if run:
            batches.append(run)
        left = rest
    return FollowStep(tuple(settled), tuple(batches), tuple(left))


@dataclass(frozen=True)
class SearchRange:
    """Ops [first, last] a search covers, and notes on what it leaves out."""

    first: int
    last: int
    notes: tuple[str, ...] = ()


def last_recorded(first: int, count: int, recorded: Container[int]) -> int:
    """The last op of the unbroken run of recorded ops from `first` (first - 1: none)."""
    last = first - 1
    while last + 1 < count and (last + 1) in recorded:
        last += 1
    return last


def search_range(count: int, capture: dict | None, recorded: Container[int]) -> SearchRange:
    """A full trace: op 0 to the end of the recorded prefix. A trace recorded with a capture budget
    (--window / --max-bytes) holds tensors for its window only: the window."""
    if capture is None:
        last = last_recorded(0, count, recorded)
        notes = (f"the trace is incomplete: searched ops 0..{last} only",) if last < count - 1 else ()
        return SearchRange(0, last, notes)
    first = int(capture.get("first", 0))
    end = min(int(capture.get("end", count)), count)
    last = min(last_recorded(first, count, recorded), end - 1)
    how = " ".join(f"--{key.replace('_', '-')} {capture[key]}" for key in ("window", "max_bytes")
                   if capture.get(key) is not None)
    note = (f"the trace holds tensors for ops {first}..{end - 1} only (recorded with {how}): "
            f"searched ops {first}..{last}; record another window to search elsewhere")
    return SearchRange(first, last, (note,))


def is_fusion_question(candidate: int, first: int, probes: Container[tuple[int, bool]]) -> bool:
    """Whether a propagated candidate of the fused probes may be a fusion bug: every input it reads is
    right (it is the first op probed, or the probe ending just before it passed)."""
    return candidate == first or (candidate - 1, False) in probes
