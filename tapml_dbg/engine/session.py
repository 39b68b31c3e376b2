"""The replay engine's state: one trace, one target, an offload set, verdicts (the position is
the `stops.Debugger`'s).

Like `bdb`, it knows nothing of terminals: every method returns result objects and reports
progress through a callback. Its jobs are split over small collaborators: `RequestBuilder`
(units and where their inputs come from), `Runtime` (the worker processes that compile and run
them, and how: a crash inside TVM becomes a verdict, not the end of the session), `IsolatedVerdicts`
(the verdict cache and batched sweeps), `judge_outputs` (the verdict rule), `Bisection` (the
search), `stops.Debugger` (breakpoints and stepping), `compile_check` (codegen only).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Callable

import numpy as np

from tapml_dbg.engine.compile_check import compile_all
from tapml_dbg.engine.isolated import IsolatedVerdicts
from tapml_dbg.engine.kept import parse_kept, with_node_groups
from tapml_dbg.engine.migrate import MigrateResult, Migration
from tapml_dbg.engine.mixed import MixedRun, MixedRunner
from tapml_dbg.engine.references import SourceReference, load_source_graph
from tapml_dbg.engine.propagation import run_on_target
from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.results import BisectResult, CompileReport, StepResult
from tapml_dbg.engine.search import Bisection
from tapml_dbg.errors import TraceError, UsageError
from tapml_dbg.judge.compare import TolerancePolicy
from tapml_dbg.judge.classify import Evidence, Facts
from tapml_dbg.judge.judge import failed_run, judge_outputs
from tapml_dbg.judge.screen import ScreenRule, rule_for
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode, Status, Verdict, WrongClass
from tapml_dbg.model.analysis import consumers_of, dead_tuple_fields
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.select import OpTable
from tapml_dbg.model.serialize import function_from_json
from tapml_dbg.runtime.messages import UnitResult
from tapml_dbg.runtime.scheduler import (DEFAULT_CACHE_DIR, Runtime, check_setup, transform_identity,
                                         warm_up_torch)
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.schema import CAST_NOTE_PREFIX

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


class Session:
    """One replay of one trace on one target."""

    def __init__(self, reader: TraceReader, spec: TargetSpec | None = None, *,
                 cache_dir: str | Path = DEFAULT_CACHE_DIR, policy: TolerancePolicy | None = None,
                 start_workers: bool = False, searching: bool = False):
        """`start_workers`: start the target worker processes now, so that they import TVM while
        this process does (what a command that will run units wants: the CLI, the REPL);
        `searching`: a bisect comes first, start the worker its chain runs on too."""
        self.reader = reader
        self.spec = spec or TargetSpec()
        self._torch_import = None  # torch imported in a thread while a search runs (bisect)
        self._transform_identity = transform_identity(self.spec.transform)  # to notice an edited pass
        self._observers: list[weakref.WeakMethod] = []  # told what the session forgot (`observe`)
        # one lane per free tracker server (or --parallel N); lane 0 also does the sequential work
        self.lanes = Runtime.open(reader.path, self.spec, cache_dir, start_workers=start_workers,
                                  searching=searching)
        try:
            self._build(reader, policy)
        except BaseException:
            self.lanes.close()
            raise

    def _build(self, reader: TraceReader, policy: TolerancePolicy | None) -> None:
        check_setup(self.spec)  # fail early on a bad target string or FILE.py:FUNC
        graph = reader.graph()
        self.main = function_from_json(graph)
        self.ops = [OpInfo.from_json(op) for op in reader.ops]
        self.by_name = {op.name: op for op in self.ops}
        self.op_table = OpTable.of(self.ops)
        self.consumers = consumers_of(self.ops)
        self.dead_fields = dead_tuple_fields(self.main)
        self.policy = policy or TolerancePolicy()
        # the live source reference: float64 references, undefined values, type changes (engine/references.py)
        self.reference = SourceReference(reader, self.ops, self.main, load_source_graph(reader))
        self.requests = RequestBuilder(reader, self.main, self.ops, self.reference.replay_casts(), graph)
        self.isolated_verdicts = IsolatedVerdicts(self.ops, self.requests, self.lanes, self.judge)
        self._mixed_runner: MixedRunner | None = None
        self.kept: frozenset[int] = frozenset()  # ops kept on the source (engine/kept.py); `reset` keeps them
        self.reset()

    @classmethod
    def open(cls, path: str | Path, spec: TargetSpec | None = None, *, cache_dir: str | Path = DEFAULT_CACHE_DIR,
             policy: TolerancePolicy | None = None, start_workers: bool = False, searching: bool = False,
             **target_options) -> "Session":
        """Open a trace; `target_options` (target=, rpc=, transform= ...) build the TargetSpec when none is given."""
        if spec is not None and target_options:
            raise TypeError("give a TargetSpec or its fields, not both")
        return cls(TraceReader(path), spec or TargetSpec(**target_options), cache_dir=cache_dir, policy=policy,
                   start_workers=start_workers, searching=searching)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.lanes.close()
        self.reader.close()
        if self._torch_import is not None:
            self._torch_import.join()  # an import cut short by the interpreter's exit can crash it

    @property
    def target(self) -> str:
        return self.spec.target

    @property
    def where(self) -> str:
        """The target and how it is reached, as reports name it ("cuda via rpc HOST:PORT")."""
        return self.spec.where

    @property
    def recorded(self) -> set[int]:
        return self.requests.recorded

    @property
    def input_names(self) -> set[str]:
        return self.requests.input_names

    @property
    def param_names(self) -> set[str]:
        return self.requests.param_names

    @property
    def pool(self):
        return self.lanes.pool

    @property
    def probes(self) -> int:
        """Units run so far (probes, verdicts, compiles)."""
        return self.lanes.units

    # ---------------------------------------------------------------- state
    def observe(self, forgot) -> None:
        """Call the bound method `forgot(what)` whenever the session forgets computed state: "transform"
        (the pass's file was edited: verdicts and target values are the old text's), "reset" (back to
        op 0). A front end's own state (a debugger's verdicts seen, its position) follows from there.
        Held weakly: a debugger that is gone is not kept alive by the session it watched."""
        self._observers.append(weakref.WeakMethod(forgot))

    def _forgot(self, what: str) -> None:
        alive = [ref for ref in self._observers if ref() is not None]
        self._observers = alive
        for ref in alive:
            forgot = ref()
            if forgot is not None:
                forgot(what)

    def notice_transform_edit(self) -> str:
        """When the transform's file was edited since the session last looked (a compiler engineer
        fixing a pass between two commands): forget what was computed under the old text (verdicts,
        target values, the compile cache's index) and say so; "" when it is unchanged. Workers load
        the new text by themselves (portable's loader keys a module by its file's text)."""
        identity = transform_identity(self.spec.transform)
        if identity == self._transform_identity:
            return ""
        self._transform_identity = identity
        self.isolated_verdicts.clear()
        self.target_values = {}
        self.lanes.forget_index()
        self._forgot("transform")
        return (f"{self.spec.transform} changed since the last command: verdicts and target values "
                "are recomputed under its new text (the compile cache rebuilds only the units it changes)")

    def reset(self) -> None:
        """Back to op 0 with every op offloaded and no target values."""
        self.offload: set[int] = set(range(len(self.ops)))
        self.target_values: dict[str, list[np.ndarray]] = {}
        self.isolated_verdicts.clear()
        self._forgot("reset")

    def set_boundary(self, k: int) -> None:
        """Offload ops [0, k): the classic gradual migration."""
        if not 0 <= k <= len(self.ops):
            raise UsageError(f"boundary must be between 0 and {len(self.ops)}")
        self.offload = set(range(k))
        self.target_values = {}

    def offload_add(self, indices: list[int]) -> None:
        self.offload.update(indices)
        self.target_values = {}

    def offload_remove(self, indices: list[int]) -> None:
        self.offload.difference_update(indices)
        self.target_values = {}

    # ---------------------------------------------------------------- kept ops (engine/kept.py)
    def set_kept(self, indices) -> list[int]:
        """Keep these ops on the source (a known bug, or one assumed fixed), with the other bindings of
        their source ops: cut out of the target's units, no verdict named. Replaces the kept set."""
        self.kept = with_node_groups(self.ops, indices)
        self.target_values = {}
        return sorted(self.kept)

    def keep(self, text: str) -> list[int]:
        """`--keep OPS`, the REPL's `keep OPS`: op selectors (`14,37`, `cumsum`, a layer) or `none`."""
        return self.set_kept(parse_kept(self.op_table, text))

    @property
    def on_target(self) -> set[int]:
        """The ops the propagated replay runs on the target: the offload set without the kept ops."""
        return self.offload - self.kept

    # ---------------------------------------------------------------- lookup
    # one set of selector rules for the whole tool: see tapml_dbg.model.select
    def resolve(self, text: str | int) -> OpInfo:
        """One op by index (`12`, `#12`, `-1`) or name; the error suggests close names."""
        return self.ops[self.op_table.op(text)]

    def layers(self) -> list[str]:
        """Every layer path and every prefix of it, in first-seen order."""
        return self.op_table.layers()

    def layer_ops(self, layer: str) -> list[int]:
        """Ops in `layer` or any layer nested in it."""
        return self.op_table.layer_ops(layer)

    def resolve_ops(self, text: str) -> list[int]:
        """Comma-separated ops, ranges `a:b` and layers: the union, sorted."""
        return self.op_table.select_many(text)

    # ---------------------------------------------------------------- values and verdicts
    def source_values(self, index: int) -> list[np.ndarray]:
        if index not in self.recorded:
            raise TraceError(self.reader.missing_values_message(index))
        return self.reader.op_outputs(index)

    def tolerance_dtype(self, index: int) -> str | None:
        """The source's own dtype when the recorder had to cast its value (e.g. fp16 mm -> fp32): an
        older trace's note. A trace with its source graph keeps its own values and lists type changes
        in the graph (engine/references.py): no note to read (a search asks for every op's)."""
        if self.reference.graph is not None:
            return None
        note = self.reader.op_note(index) if index in self.recorded else ""
        return note[len(CAST_NOTE_PREFIX):] if note.startswith(CAST_NOTE_PREFIX) else None

    def judge(self, index: int, mode: Mode, result: UnitResult, outputs: list[np.ndarray] | None,
              rerun: list[np.ndarray] | None = None, fed_by_target: set[str] | None = None) -> Verdict:
        """The verdict of op `index` given what its unit returned (`rerun`: a second run's outputs,
        the evidence of a `nondeterministic` class; `fed_by_target`: the ops whose target values fed
        it, when not the session's propagated replay, e.g. in a mixed run)."""
        op = self.ops[index]
        if not result.ok:  # of class `type` when the op's import changed a type the model reads
            dead = self.dead_fields.get(op.name, set())
            changes = [c for c in self.reference.type_changes.get(index, []) if c.output not in dead]
            return failed_run(index, op.name, mode, result.status, result.message, Facts(changes))
        if index not in self.recorded:
            return Verdict(index, op.name, mode, Status.MISSING, message=self.reader.missing_values_message(index))
        reference = self.reference.isolated(index) if mode == ISOLATED else self.reference.propagated(index)
        if fed_by_target is None:
            fed_by_target = set(self.target_values) if mode == PROPAGATED else set()
        facts = Facts(self.reference.type_changes.get(index, []),
                      self.requests.cast_inputs(index, fed_by_target, self.dead_fields))

        def evidence() -> Evidence:
            found = self.reference.low_precision(index)
            found.rerun = rerun
            return found

        verdict = judge_outputs(index, op.name, mode, outputs, self.source_values(index), self.policy,
                                self.tolerance_dtype(index), self.dead_fields.get(op.name, set()),
                                reference=reference, facts=facts, evidence=evidence)
        if mode == PROPAGATED and verdict.status == Status.FAIL and verdict.wrong != WrongClass.TYPE:
            self._inherit_class(verdict)
        return verdict

    def screen_rule(self, mode: Mode) -> ScreenRule:
        """What a search checks values against before it asks for a verdict (judge/screen.py)."""
        return rule_for(self.policy, mode == PROPAGATED)

    def unscreened(self) -> set[str]:
        """Ops only a full verdict can judge: a per-op tolerance, uninitialised elements, a value the
        recorder cast (its tolerance is its source dtype's)."""
        names = set(self.policy.by_op)
        names.update(self.ops[i].name for i in self.reference.undefined_masks())
        names.update(self.ops[i].name for i in self.recorded if self.tolerance_dtype(i))
        return names

    def _inherit_class(self, verdict: Verdict) -> None:
        """A propagated failure of an op that is right alone (its isolated verdict passed) is the kind of
        wrong of the upstream op it comes from: the nearest ancestor whose isolated verdict failed. One
        of an op that is wrong alone too, and unexplained by its own inputs, is its isolated kind."""
        own = self.isolated_verdicts.cache.get(verdict.index)
        if own is not None and own.status == Status.FAIL and own.wrong is not None \
                and verdict.wrong == WrongClass.SEMANTIC:
            verdict.wrong, verdict.evidence = own.wrong, f"as the op alone (isolated): {own.evidence}"
            return
        if own is None or not own.passed:
            return
        seen, frontier = set(), list(self.ops[verdict.index].inputs)
        while frontier:
            name = frontier.pop(0)
            upstream = self.by_name.get(name)
            if upstream is None or upstream.index in seen:
                continue
            seen.add(upstream.index)
            cached = self.isolated_verdicts.cache.get(upstream.index)
            if cached is not None and cached.status == Status.FAIL and cached.wrong is not None:
                verdict.wrong = cached.wrong
                verdict.evidence = (f"the op alone passes; the error arrives from #{upstream.index} {upstream.name} "
                                    f"({cached.wrong}: {cached.evidence})")
                return
            frontier.extend(upstream.inputs)
        verdict.evidence = f"the op alone passes (isolated); the error arrives from upstream. {verdict.evidence}"

    def explain(self, verdict: Verdict, upstream: dict[str, list[np.ndarray]] | None = None) -> Verdict:
        """A failing verdict judged again with a second run of its unit on the target, so that a
        nondeterministic kernel (an out-of-bounds read, a race) is told from a wrong one.
        `upstream`: the target values that fed a propagated verdict (a search's chain), run again
        as they are instead of the session's propagated replay."""
        if verdict.status != Status.FAIL or verdict.wrong == WrongClass.TYPE:
            return verdict
        index = verdict.index
        fed = None
        try:
            if verdict.mode == ISOLATED or upstream is not None:
                name = self.ops[index].name
                first = self.isolated_verdicts.failed_run(index) if upstream is None else None  # the sweep's
                runs = [first] if first is not None else []
                while len(runs) < 2:
                    runs.append(self.lanes.run(self.requests.ops_request([name], [name], upstream)))
                outputs = [run.outputs[0] if run.ok else None for run in runs]
                fed = set(upstream) if upstream is not None else None
            else:  # the first run computes the target's upstream values; the next two are the same unit
                runs = [self._propagated_values(index) for _ in range(3)][1:]
                outputs = [run[1] for run in runs]
                runs = [run[0] for run in runs]
        except TraceError:
            return verdict
        if not runs[0].ok or outputs[0] is None or outputs[1] is None:
            return verdict
        explained = self.judge(index, verdict.mode, runs[0], outputs[0], rerun=outputs[1], fed_by_target=fed)
        if verdict.mode == ISOLATED:
            self.isolated_verdicts.cache[index] = explained
        return explained

    def type_changed_ops(self) -> list[int]:
        """Ops whose import declares another dtype or shape than the source computed for an output
        the model reads (a type verdict each), in order."""
        return sorted(index for index, changes in self.reference.type_changes.items()
                      if any(c.output not in self.dead_fields.get(self.ops[index].name, set()) for c in changes))

    def invalidate_verdicts(self) -> None:
        """Forget cached verdicts, e.g. after the tolerance policy changed."""
        self.isolated_verdicts.clear()

    def isolated(self, index: int) -> Verdict:
        """The op alone, fed recorded source inputs: is this kernel wrong?"""
        return self.isolated_verdicts.get(index)

    def isolated_many(self, indices: list[int], progress: Progress = _noop) -> dict[int, Verdict]:
        """Isolated verdicts of many ops, batched and spread over the lanes (no early stop)."""
        self.isolated_verdicts.fill(list(indices), progress=progress)
        return {index: self.isolated(index) for index in indices}

    def propagated(self, index: int) -> Verdict:
        """The op fed the target's own upstream values (ops in the offload set run on the target)."""
        return self._propagated_run(index)[0]

    def _propagated_run(self, index: int) -> tuple[Verdict, list[np.ndarray] | None]:
        op = self.ops[index]
        try:
            result, outputs = self._propagated_values(index)
        except TraceError as exc:
            return Verdict(index, op.name, PROPAGATED, Status.MISSING, message=str(exc)), None
        return self.judge(index, PROPAGATED, result, outputs), outputs

    def _propagated_values(self, index: int) -> tuple[UnitResult, list[np.ndarray] | None]:
        """Run op `index` on the target fed its offloaded ancestors' target values (computing the missing
        ones): the propagated values of engine/propagation.py."""
        missing = [i for i in self._offloaded_ancestors(index) if self.ops[i].name not in self.target_values]
        run = run_on_target(self, sorted(set(missing) | {index}), fed=self.target_values)
        for name, values in run.values.items():  # only offloaded ops feed later ops with target values
            if self.by_name[name].index in self.on_target:
                self.target_values[name] = values
        return run.result, run.values.get(self.ops[index].name) if run.result.ok else None

    def _offloaded_ancestors(self, index: int) -> list[int]:
        seen: set[int] = set()
        stack = list(self.ops[index].inputs)
        while stack:
            name = stack.pop()
            op = self.by_name.get(name)
            if op is None or op.index in seen or op.index not in self.on_target:
                continue
            seen.add(op.index)
            stack.extend(op.inputs)
        return sorted(seen)

    def step_result(self, index: int, isolated: Verdict | None = None, propagated: Verdict | None = None) -> StepResult:
        op = self.ops[index]
        return StepResult(op.index, op.name, op.op, op.layer, isolated, propagated, step=op.step)

    def compare(self, index: int) -> StepResult:
        """Both verdicts of one op, side by side."""
        return self.step_result(index, self.isolated(index), self.propagated(index))

    def target_output(self, index: int, mode: Mode) -> list[np.ndarray] | None:
        """The target's value of an op in a mode (computing it if needed); None on failure."""
        if mode == PROPAGATED:
            return self._propagated_run(index)[1]
        name = self.ops[index].name
        result = self.lanes.run(self.requests.ops_request([name], [name]))
        return result.outputs[0] if result.ok else None

    # ---------------------------------------------------------------- running
    def run_op(self, index: int) -> StepResult:
        """Op `index` run on the target with both verdicts (a kept op runs on the source: none)."""
        return self.step_result(index) if index in self.kept else self.compare(index)

    def bisect(self, sweep: bool = True, progress: Progress = _noop) -> BisectResult:
        """Find the first divergent op (the phases: `engine.search.Bisection`)."""
        edited = self.notice_transform_edit()
        result = Bisection(self, sweep, progress).run()
        if edited:
            result.notes.insert(0, edited)
        return result

    def warm_up_torch(self) -> None:
        """Import torch in a thread, for the full verdicts (their float64 references), once a search
        waits on its workers: started any earlier, the import holds the GIL while this thread
        builds the chain's request, several times slower (figures: docs/perf.md)."""
        if self.reference.available and self._torch_import is None:
            self._torch_import = warm_up_torch()

    def run_mixed(self, offload: list[int] | None = None, verdicts: bool = True,
                  progress: Progress = _noop) -> MixedRun:
        """The whole model once: `offload` (default: the offload set) on the target, the rest on the
        source runner (`engine.mixed`)."""
        chosen = sorted(self.offload) if offload is None else offload
        return self.mixed_runner.run(chosen, verdicts=verdicts, progress=progress)

    def migrate(self, by: str = "layer", one_at_a_time: bool = False, progress: Progress = _noop) -> MigrateResult:
        """TapML's gradual offload, one mixed run per step, and the op that breaks the output (`engine.migrate`)."""
        return Migration(self, by, one_at_a_time, progress, self.mixed_runner).run()

    @property
    def mixed_runner(self) -> MixedRunner:
        if self._mixed_runner is None:
            self._mixed_runner = MixedRunner(self)
        return self._mixed_runner

    def compile_all(self, progress: Progress = _noop) -> CompileReport:
        """Compile every op for the target without running it; failures become verdicts."""
        return compile_all(self, progress)
