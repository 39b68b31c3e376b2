"""Judge one op's target outputs against its source values: the one place a verdict is made."""

from __future__ import annotations

import numpy as np

from tapml_dbg.judge.compare import TolerancePolicy, compare_arrays, dtype_name
from tapml_dbg.judge.verdict import Mode, Status, Verdict


def failed_run(index: int, name: str, mode: Mode, status: str, message: str) -> Verdict:
    """The verdict of a unit that did not run to the end (compile-error, crash, timeout, error)."""
    return Verdict(index, name, mode, Status(status), message=message)


def judge_outputs(index: int, name: str, mode: Mode, outputs: list[np.ndarray], source: list[np.ndarray],
                  policy: TolerancePolicy, tolerance_dtype: str | None = None,
                  unread: set[int] = frozenset()) -> Verdict:
    """Compare every output under the policy's tolerance for its dtype and mode.

    `tolerance_dtype`: the source's own dtype when the recorder had to cast its value (its
    tolerance is the one that applies). `unread`: outputs nothing in the model reads (e.g. the
    indices of max_pool2d_with_indices): reported, never failing the verdict.
    """
    if len(outputs) != len(source):
        return Verdict(index, name, mode, Status.FAIL, message=f"{len(outputs)} outputs vs {len(source)} recorded")
    metrics = [compare_arrays(t, s, policy.for_value(tolerance_dtype or dtype_name(s), name, mode == Mode.PROPAGATED))
               for t, s in zip(outputs, source)]
    live = [m for k, m in enumerate(metrics) if k not in unread]
    status = Status.PASS if all(m.passed for m in live) else Status.FAIL
    ignored = [k for k in sorted(unread) if k < len(metrics) and not metrics[k].passed]
    message = (f"output(s) {', '.join(map(str, ignored))} differ but nothing reads them (ignored in the verdict)"
               if ignored else "")
    return Verdict(index, name, mode, status, live or metrics, message)
