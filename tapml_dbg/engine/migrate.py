"""TapML's gradual migration as one command: grow the offloaded part of the model step by step, one
mixed run per step (engine/mixed.py), watch the model's output, and name the op that breaks it.

Steps (docs/migrate.md):
- `by=layer` (default): the offloaded prefix grows one top-level block at a time (`transformer.h.0`,
  then `.h.1` ...); ops before the first block join step 1, ops after the last block (final norm,
  head) join the last step, which therefore offloads the whole model;
- `by=op`: the prefix grows one op at a time (one mixed run per op: for small models);
- `one_at_a_time`: only one block (or op) on the target, the rest on the source: layers ranked by
  how far each alone moves the output; ops outside every block form two extra entries.

The culprit: in the first failing step (the top-ranked failing entry one at a time), a bisection
over the ops that step newly offloads finds the first whose offload breaks the output, and its
verdicts say whether it is wrong alone (isolated) or breaks it with the values it is fed.
Every step cuts its target units at the same block ends, so a step compiles only its new block.
Kept ops (engine/kept.py) stay on the source in every step and are never the culprit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

from tapml_dbg.engine.kept import host_only_note, kept_note
from tapml_dbg.engine.mixed import MixedRun, MixedRunner, blocks_in
from tapml_dbg.model.generation import step_ranges
from tapml_dbg.engine.results import Culprit
from tapml_dbg.engine.search import SearchTrace, first_failing
from tapml_dbg.engine.verdicts import Verdicts
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Verdict

Progress = Callable[..., None]
BEFORE_BLOCKS, AFTER_BLOCKS = "(before the blocks)", "(after the blocks)"  # one-at-a-time entries of other ops
BREAKS_OUTPUT = ("right alone and in the run, yet offloading it takes the model's output past its tolerance: "
                 "the error it adds is amplified downstream")


class By(StrEnum):
    """What one migration step adds to the target."""

    LAYER = "layer"
    OP = "op"


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass
class MigrationStep:
    """One step: what it offloads, what it adds, and its mixed run."""

    number: int  # 1-based, as the table shows it
    label: str  # the block (or op) the step adds
    offload: list[int]
    new: list[int]  # ops this step adds to the target (one at a time: every offloaded op)
    run: MixedRun

    @property
    def passed(self) -> bool:
        return self.run.passed

    @property
    def error(self) -> float | None:
        """The output's end-to-end error; None where it is not finite or the run failed."""
        return _finite_or_none(self.run.error)

    def to_json(self) -> dict:
        worst = self.run.worst
        return {"step": self.number, "label": self.label, "offload": list(self.offload), "new": list(self.new),
                "passed": self.passed, "error": self.error,
                "metrics": worst.metrics.to_json() if worst is not None and worst.metrics else {},
                "top1_agreement": self.run.top1, "failure": self.run.failure or None,
                "units": self.run.units, "compiled": self.run.compiled, "reused": self.run.reused,
                "seconds": round(self.run.seconds, 3)}


@dataclass
class MigrateResult:
    by: By
    one_at_a_time: bool
    target: str
    ops: int
    steps: list[MigrationStep]
    first_failing_step: int | None = None  # a step number
    ranking: list[int] = field(default_factory=list)  # one at a time: step numbers, largest output error first
    culprit: Culprit | None = None
    culprit_step: int | None = None  # the step the culprit was searched in
    probes: int = 0  # mixed runs of the culprit search
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def compiled(self) -> int:
        return sum(step.run.compiled for step in self.steps)

    @property
    def units(self) -> int:
        return sum(step.run.units for step in self.steps)

    @property
    def reused(self) -> int:
        return sum(step.run.reused for step in self.steps)

    def to_json(self) -> dict:
        return {"by": self.by, "one_at_a_time": self.one_at_a_time, "target": self.target, "ops": self.ops,
                "steps": [step.to_json() for step in self.steps], "first_failing_step": self.first_failing_step,
                "ranking": self.ranking, "culprit": self.culprit.to_json() if self.culprit else None,
                "culprit_step": self.culprit_step, "probes": self.probes, "units": self.units,
                "compiled": self.compiled, "reused": self.reused, "seconds": round(self.seconds, 3),
                "notes": self.notes}


def _finite_or_none(value: float) -> float | None:
    return None if value == float("inf") else value


# ---------------------------------------------------------------------------- the plan
def plan_steps(runner: MixedRunner, by: By, one_at_a_time: bool) -> list[tuple[str, list[int], list[int]]]:
    """(label, offload, new) of every step. In a generation trace a block recurs in every generation
    step: a migration step then moves that block of every generation step (and the ops outside the
    blocks that join it in each) to the target."""
    ops = runner.ops
    count = len(ops)
    if by == By.OP:
        if one_at_a_time:
            return [(f"#{op.index} {op.name}", [op.index], [op.index]) for op in ops]
        return [(f"#{op.index} {op.name}", list(range(op.index + 1)), [op.index]) for op in ops]
    blocks = runner.blocks
    if not blocks:
        raise UsageError("the model has no layers to migrate by: use `--by op`")
    spans = step_ranges(ops)
    every = " in every step" if len(spans) > 1 else ""
    if one_at_a_time:
        inside = {index for block in blocks for index in block.indices}
        before = [i for span in spans for i in span
                  if i not in inside and i < min((b.indices[0] for b in blocks_in(blocks, span)), default=span.stop)]
        after = [i for i in range(count) if i not in inside and i not in set(before)]
        entries = [(BEFORE_BLOCKS, before)] if before else []
        entries += [(block.label + every, list(block.indices)) for block in blocks]
        entries += [(AFTER_BLOCKS, after)] if after else []
        return [(label, indices, indices) for label, indices in entries]
    offload: list[int] = []
    news: list[list[int]] = [[] for _ in blocks]
    for span in spans:  # per generation step: the prefix grows one block at a time, as in one forward
        local = {block.label: block for block in blocks_in(blocks, span)}
        start = span.start
        for number, block in enumerate(blocks):
            last = number == len(blocks) - 1
            end = span.stop if last else (local[block.label].end if block.label in local else start)
            news[number] += list(range(start, max(start, end)))
            start = max(start, end)
    steps = []
    for block, new in zip(blocks, news):
        offload = sorted(set(offload) | set(new))
        others = len(new) - len(block.indices)  # ops outside every block that join this step
        label = block.label + every + (f" +{others} ops outside the blocks" if others else "")
        steps.append((label, offload, new))
    return steps


# ---------------------------------------------------------------------------- the migration
class Migration:
    """One migration of a session's trace (see the module docstring)."""

    def __init__(self, runner: MixedRunner, verdicts: Verdicts, by: By | str = By.LAYER, one_at_a_time: bool = False,
                 progress: Progress = _noop):
        try:
            self.by = By(by)
        except ValueError:
            raise UsageError(f"unknown --by {by!r}: give {' or '.join(b.value for b in By)}") from None
        self.ops = runner.ops
        self.kept = runner.kept
        self.verdicts = verdicts
        self.one_at_a_time = one_at_a_time
        self.progress = progress
        if self.by == By.OP:  # one unit per op: a step compiles its one new op, every other unit is cached
            runner = runner.with_bounds(list(range(len(self.ops) + 1)))
        self.runner = runner

    def run(self) -> MigrateResult:
        started = time.perf_counter()
        plan = plan_steps(self.runner, self.by, self.one_at_a_time)
        result = MigrateResult(self.by, self.one_at_a_time, self.runner.where, len(self.ops), [])
        for number, (label, offload, new) in enumerate(plan, start=1):
            self.progress(number - 1, len(plan), f"step {number}: {label}")
            result.steps.append(MigrationStep(number, label, offload, new, self.runner.run(offload)))
        self.progress(len(plan), len(plan), "steps done")
        if self.kept.user:
            result.notes.append(kept_note(self.ops, self.kept.user, mixed=True))
        if self.kept.host_only:
            result.notes.append(host_only_note(self.kept.host_only, mixed=True))
        failing = [step for step in result.steps if not step.passed]
        if self.one_at_a_time:
            ranked = sorted(result.steps, key=lambda step: (-step.run.error, step.number))
            result.ranking = [step.number for step in ranked]
            searched = next((step for step in ranked if not step.passed), None)
            base: list[int] = []
        else:
            searched = failing[0] if failing else None
            before = result.steps[searched.number - 2] if searched is not None and searched.number > 1 else None
            base = list(before.offload) if before is not None else []
        result.first_failing_step = failing[0].number if failing else None
        if searched is not None:
            result.culprit_step = searched.number
            result.culprit, result.probes = self.culprit(base, searched.new)
        result.seconds = time.perf_counter() - started
        return result

    def culprit(self, base: list[int], new: list[int]) -> tuple[Culprit | None, int]:
        """The first op of `new` whose offload (on top of `base` and the ops of `new` before it) breaks
        the output, with its verdicts; and the mixed runs the search took."""
        trace = SearchTrace()
        runs: dict[int, MixedRun] = {}
        new = [index for index in new if index not in self.kept.all]  # offloading one changes nothing

        def breaks(j: int) -> bool:
            self.progress(len(trace.probes), None, f"culprit search: {len(new[:j + 1])} of {len(new)} ops")
            runs[j] = self.runner.run(base + new[:j + 1])
            return not runs[j].passed

        found = first_failing(0, len(new) - 1, breaks, trace)
        if found is None:
            return None, len(trace.probes)
        index = new[found]
        mixed = self.runner.run(base + new[:found + 1], verdicts=True)
        return self._culprit(index, mixed), len(trace.probes) + 1

    def _culprit(self, index: int, mixed: MixedRun) -> Culprit:
        op = self.ops[index]
        isolated = self.verdicts.isolated(index)
        in_run: Verdict | None = mixed.verdicts.get(index)
        if isolated.failed:
            chosen, kind = isolated, ISOLATED
        elif in_run is not None and in_run.failed:
            chosen, kind = in_run, PROPAGATED
        else:
            worst = mixed.worst
            return Culprit(op.index, op.name, op.op, op.layer, PROPAGATED, worst.metrics if worst else None,
                           BREAKS_OUTPUT, source_location=op.source_location, step=op.step)
        kind = kind if chosen.status.judged else chosen.status
        return Culprit(op.index, op.name, op.op, op.layer, kind, chosen.worst, chosen.message, chosen.wrong,
                       chosen.evidence, source_location=op.source_location, step=op.step)

