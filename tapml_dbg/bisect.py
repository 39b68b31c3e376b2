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
