"""Pure search logic for bisection: no I/O, no TVM, just a pass/fail predicate over op indices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class SearchTrace:
    """The probes a search made, in order, as (index, failed)."""

    probes: list[tuple[int, bool]] = field(default_factory=list)


def first_failing(lo: int, hi: int, failed: Callable[[int], bool], trace: SearchTrace | None = None) -> int | None:
    """Smallest k in [lo, hi] with `failed(k)`, assuming failures persist once they start.

    Probes `hi` first (is anything wrong at all?), then halves, so the cost is 1 + ceil(log2(n))
    probes. When failures do not persist the answer is still a transition point: `failed(k)`
    is true and `failed(k - 1)` false (or k == lo).
    """
    trace = trace if trace is not None else SearchTrace()

    def probe(k: int) -> bool:
        result = bool(failed(k))
        trace.probes.append((k, result))
        return result

    if hi < lo or not probe(hi):
        return None
    good, bad = lo - 1, hi  # invariant: failed(bad) is true; failed(good) false (or good < lo)
    while bad - good > 1:
        middle = (good + bad) // 2
        if probe(middle):
            bad = middle
        else:
            good = middle
    return bad


def chunks(indices: list[int], size: int) -> list[list[int]]:
    """Split indices into runs of at most `size`, for batched isolated sweeps."""
    return [indices[start:start + size] for start in range(0, len(indices), max(size, 1))]


def first_failing_speculative(lo: int, hi: int, failed_many: Callable[[list[int]], list[bool]], width: int,
                              trace: SearchTrace | None = None) -> int | None:
    """`first_failing`'s answer and probe path, probing up to `width` points per round.

    `failed_many(ks)` returns `failed(k)` for each k of a round (e.g. computed side by side).
    Each round probes the first `width` not-yet-known points of `first_failing`'s own decision
    tree, breadth first from where the search stands ("failed" branch first on a tie: its prefix
    is the shorter, cheaper probe); the search then follows the tree as far as the known results
    go. So for any deterministic `failed` (persistent or not) the answer and `trace.probes` are
    exactly `first_failing`'s; probes off the path are wasted work, at most `width - 1` a round.
    With `width == 1` it makes the same calls as `first_failing`.
    """
    trace = trace if trace is not None else SearchTrace()
    if hi < lo:
        return None
    width = max(1, int(width))
    known: dict[int, bool] = {}

    def probe_point(state: tuple) -> int | None:  # None: the state is an answer
        if state[0] == "top":
            return hi
        if state[0] == "done":
            return None
        good, bad = state[1], state[2]
        return (good + bad) // 2 if bad - good > 1 else None

    def follow(state: tuple, result: bool) -> tuple:
        if state[0] == "top":  # is anything wrong at all?
            return ("range", lo - 1, hi) if result else ("done", None, None)
        good, bad = state[1], state[2]
        middle = (good + bad) // 2
        return ("range", good, middle) if result else ("range", middle, bad)

    state: tuple = ("top", None, None)
    while True:
        point = probe_point(state)
        while point is not None and point in known:  # walk the path as far as results are known
            trace.probes.append((point, known[point]))
            state = follow(state, known[point])
            point = probe_point(state)
        if point is None:
            return None if state[0] == "done" else state[2]
        wanted: list[int] = []
        level = [state]
        while level and len(wanted) < width:
            below = []
            for node in level:
                k = probe_point(node)
                if k is None:
                    continue
                if k in known:
                    below.append(follow(node, known[k]))
                    continue
                if len(wanted) < width and k not in wanted:
                    wanted.append(k)
                    below += [follow(node, True), follow(node, False)]
            level = below
        results = failed_many(wanted)
        known.update((k, bool(r)) for k, r in zip(wanted, results))
