"""What a divergent op's verdicts say about where its bug is: one sentence, its only wording.

bisect and migrate (a culprit), the REPL's `compare`, `show` and `continue`, the report's culprit
card and a dump's README all word an op's diagnosis with `diagnosis()`, so one op never reads as
two different bugs. The rule:

1. The deciding verdict is the isolated one when the op alone fails, else the propagated one
   (`deciding`); its kind is its mode when it was judged, else the failed run's status
   (compile-error, crash, timeout, error).
2. A `type` class decides first, unless the deciding verdict is propagated: the op's own import
   declares another dtype or shape than the source computed, a frontend divergence, whatever its
   symptom on the target (a bool cumsum that does not compile is one). A propagated `type` failure
   is right alone and fed values whose producer's import changed their type: a propagated one.
3. Otherwise the kind decides (MEANINGS).
"""

from __future__ import annotations

from tapml_dbg.judge.verdict import FUSED, ISOLATED, PROPAGATED, Status, Verdict, WrongClass

TYPE_MEANING = "the import declares another dtype or shape than the source computed: a frontend divergence"
MEANINGS = {  # the deciding verdict's kind -> what it says, in the words of docs/repl.md
    ISOLATED: "the op alone, fed the recorded source inputs, is wrong on the target: a kernel or codegen bug",
    PROPAGATED: "the op alone is right; the error arriving from upstream grows past the tolerance here",
    FUSED: "every input is right and the op passes alone, yet compiled with its producers as one function it is "
           "wrong: a fusion or schedule bug (dump --ops writes the unit as a repro)",
    Status.COMPILE_ERROR: "the op does not compile for the target",
    Status.CRASH: "running the op crashed the target worker",
    Status.TIMEOUT: "the op did not finish within --timeout",
    Status.ERROR: "the op ran on the target but gave no value",
}
PASSED = "both verdicts pass"  # no diagnosis: nothing diverges


def diagnosis(kind: str, wrong: str | None = None) -> str:
    """The sentence for a divergent op whose deciding verdict is of `kind` (a mode, or a failed run's
    status) and whose class is `wrong` ("" for a kind without a sentence, such as pass)."""
    if wrong == WrongClass.TYPE and kind != PROPAGATED:
        return TYPE_MEANING
    return MEANINGS.get(str(kind), "")


def kind_of(verdict: Verdict) -> str:
    """A verdict's kind as culprits name it: its mode when it was judged, else its run's status."""
    return str(verdict.mode if verdict.status.judged else verdict.status)


def deciding(isolated: Verdict | None, propagated: Verdict | None) -> Verdict | None:
    """The verdict that names an op's divergence: the isolated one when the op alone fails, else the
    propagated one when it fails; None when neither fails."""
    for verdict in (isolated, propagated):
        if verdict is not None and verdict.failed:
            return verdict
    return None


def diagnose(isolated: Verdict | None, propagated: Verdict | None) -> str:
    """The sentence for an op from its two verdicts: PASSED when both pass, "" when nothing is known."""
    verdict = deciding(isolated, propagated)
    if verdict is not None:
        return diagnosis(kind_of(verdict), verdict.wrong)
    if isolated is not None and propagated is not None and isolated.passed and propagated.passed:
        return PASSED
    return ""
