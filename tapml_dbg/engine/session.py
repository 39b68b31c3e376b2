"""The replay engine's state: one trace, one target, its kept ops, and the collaborators that do
the jobs (the position is the `stops.Debugger`'s).

Like `bdb`, it knows nothing of terminals: every method returns result objects and reports
progress through a callback. The jobs: `RequestBuilder` (units and where their inputs come from),
`Runtime` (the worker processes that compile and run them, and how: a crash inside TVM becomes a
verdict, not the end of the session), `Verdicts` (the verdict rule and what a verdict says:
`session.verdicts`), `IsolatedVerdicts` (the isolated-verdict cache and batched sweeps),
`PropagatedReplay` (the offload set and the target values of the propagated replay:
`session.replay`), `Bisection` (the search), `MixedRunner` (mixed runs), `compile_check` (codegen only).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Callable

import numpy as np

from tapml_dbg.engine.compile_check import compile_all
from tapml_dbg.engine.isolated import IsolatedVerdicts
from tapml_dbg.engine.kept import host_only_of, host_only_verdict, parse_kept, with_node_groups
from tapml_dbg.engine.migrate import MigrateResult, Migration
from tapml_dbg.engine.mixed import MixedRun, MixedRunner
from tapml_dbg.engine.reference import FAILED_RUN_VERDICTS, RecordedSource, Reference, trusted_target
from tapml_dbg.engine.references import SourceReference, load_source_graph
from tapml_dbg.engine.propagation import PropagatedReplay
from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.results import BisectResult, CompileReport, StepResult
from tapml_dbg.engine.search import Bisection
from tapml_dbg.engine.verdicts import Verdicts
from tapml_dbg.errors import TargetError, TraceError
from tapml_dbg.judge.compare import TolerancePolicy
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Verdict
from tapml_dbg.model.analysis import consumers_of, dead_tuple_fields
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.select import OpTable
from tapml_dbg.model.serialize import function_from_json
from tapml_dbg.runtime.scheduler import (DEFAULT_CACHE_DIR, Runtime, check_setup, transform_identity,
                                         transform_retyped, warm_up_torch)
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.trace import TraceReader

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


class Session:
    """One replay of one trace on one target."""

    def __init__(self, reader: TraceReader, spec: TargetSpec | None = None, *,
                 cache_dir: str | Path = DEFAULT_CACHE_DIR, policy: TolerancePolicy | None = None,
                 start_workers: bool = False, searching: bool = False, against: Reference | None = None):
        """`start_workers`: start the target worker processes now, so that they import TVM while
        this process does (what a command that will run units wants: the CLI, the REPL);
        `searching`: a bisect comes first, start the worker its chain runs on too."""
        self.reader = reader
        self.spec = spec or TargetSpec()
        # what the target is judged against: the recorded values, or a trusted target's (engine/reference.py)
        self.against = against or RecordedSource(Path(reader.path), str(reader.meta.get("source", "torch")))
        self._torch_import = None  # torch imported in a thread while a search runs (bisect)
        self._transform_identity = transform_identity(self.spec.transform)  # to notice an edited pass
        self._observers: list[weakref.WeakMethod] = []  # told what the session forgot (`observe`)
        # one lane per free tracker server (or --parallel N); lane 0 also does the sequential work
        self.target, self.where = self.spec.target, self.spec.where  # where: "cuda via rpc HOST:PORT"
        self.lanes = Runtime.open(reader.path, self.spec, cache_dir, start_workers=start_workers,
                                  searching=searching)
        self.pool = self.lanes.pool
        try:
            self._build(reader, policy)
        except BaseException:
            self.lanes.close()
            raise

    def _build(self, reader: TraceReader, policy: TolerancePolicy | None) -> None:
        check_setup(self.spec)  # fail early on a bad target string or FILE.py:FUNC
        reader.weights.require()  # a referenced checkpoint file missing or changed: one line, before any unit runs
        graph = reader.outline.graph()
        self.main = function_from_json(graph)
        self.ops = [OpInfo.from_json(op) for op in reader.outline.ops]
        self.by_name = {op.name: op for op in self.ops}
        self.op_table = OpTable.of(self.ops)
        self.consumers = consumers_of(self.ops)
        self.dead_fields = dead_tuple_fields(self.main)
        self.policy = policy or TolerancePolicy()
        # the live source reference: float64 references, undefined values, type changes (engine/references.py)
        self.reference = SourceReference(reader, self.ops, self.main, load_source_graph(reader))
        self.requests = RequestBuilder(reader, self.main, self.ops,
                                       self.reference.replay_casts(transform_retyped(self.spec)), graph)
        self.recorded, self.input_names, self.param_names = (self.requests.recorded, self.requests.input_names,
                                                             self.requests.param_names)
        self.verdicts = Verdicts(self)
        self.isolated_verdicts = IsolatedVerdicts(self.ops, self.requests, self.lanes, self.verdicts.judge)
        self.replay = PropagatedReplay(self)
        self._mixed_runner: MixedRunner | None = None
        # ops TVM cannot import, run on the host in every replay: kept always (engine/kept.py)
        self.host_only = host_only_of(self.main, self.ops, reader.meta)
        self.host_only_ops = frozenset(entry.index for entry in self.host_only)
        self.user_kept: frozenset[int] = frozenset()  # the ops the user keeps (`--keep`): what results list as kept
        # TVM-wide ops the reference target cannot build or run either: kept on the source, so that a search
        # against a reference target never stops at a bug every TVM target shares (engine/reference.py)
        self.reference_kept = with_node_groups(self.ops, [op.index for op in self.against.tvm_wide
                                                          if op.verdict in FAILED_RUN_VERDICTS])
        self.kept: frozenset[int] = self.host_only_ops | self.reference_kept  # ops kept on the source (engine/kept.py), host-only ones too; `reset` keeps them
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
        if self._mixed_runner is not None:
            self._mixed_runner.close()  # a TVM-source trace's source target runtime, where a mixed run opened it
        self.lanes.close()
        self.reader.close()
        if self._torch_import is not None:
            self._torch_import.join()  # an import cut short by the interpreter's exit can crash it

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
        self.requests.set_casts(self.reference.replay_casts(transform_retyped(self.spec)))  # what it retypes
        self.isolated_verdicts.clear()
        self.replay.forget()
        self.lanes.forget_index()
        self._forgot("transform")
        return (f"{self.spec.transform} changed since the last command: verdicts and target values "
                "are recomputed under its new text (the compile cache rebuilds only the units it changes)")

    def reset(self) -> None:
        """Back to op 0 with every op offloaded and no target values."""
        self.replay.reset()
        self.isolated_verdicts.clear()
        self._forgot("reset")

    # ---------------------------------------------------------------- kept ops (engine/kept.py)
    def set_kept(self, indices) -> list[int]:
        """Keep these ops on the source (a known bug, or one assumed fixed), with the other bindings of
        their source ops: cut out of the target's units, no verdict named. Replaces the kept set."""
        self.user_kept = with_node_groups(self.ops, indices)
        self.kept = self.user_kept | self.host_only_ops | self.reference_kept
        self.replay.forget()
        return sorted(self.user_kept)

    def keep(self, text: str) -> list[int]:
        """`--keep OPS`, the REPL's `keep OPS`: op selectors (`14,37`, `cumsum`, a layer) or `none`."""
        return self.set_kept(parse_kept(self.op_table, text))

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
            raise TraceError(self.reader.recorded.missing_values_message(index))
        return self.reader.tensors.op_outputs(index)

    def isolated(self, index: int) -> Verdict:
        """The op alone, fed recorded source inputs: is this kernel wrong? (A host-only op: no verdict.)"""
        if index in self.host_only_ops:
            return host_only_verdict(self.host_only, index, ISOLATED)
        return self.isolated_verdicts.get(index)

    def propagated(self, index: int) -> Verdict:
        """The op fed the target's own upstream values (ops in the offload set run on the target)."""
        if index in self.host_only_ops:
            return host_only_verdict(self.host_only, index, PROPAGATED)
        return self.replay.verdict(index)[0]

    def step_result(self, index: int, isolated: Verdict | None = None, propagated: Verdict | None = None) -> StepResult:
        op = self.ops[index]
        return StepResult(op.index, op.name, op.op, op.layer, isolated, propagated, step=op.step)

    def compare(self, index: int) -> StepResult:
        """Both verdicts of one op, side by side."""
        return self.step_result(index, self.isolated(index), self.propagated(index))

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
        return self.attributed(result)

    def attributed(self, result: BisectResult) -> BisectResult:
        """`result` told what it was judged against: the reference, its TVM-wide ops, whose the culprit is."""
        result.reference, result.tvm_wide = self.against.to_json(), list(self.against.tvm_wide)
        if result.culprit is not None:
            result.culprit.attribution = self.against.attribution(result.culprit.index)
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
        chosen = sorted(self.replay.offload) if offload is None else offload
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


def open_judged(path: str | Path, spec: TargetSpec, *, reference: TargetSpec | None = None,
                cache_dir: str | Path = DEFAULT_CACHE_DIR, start_workers: bool = False, searching: bool = False,
                progress: Progress = _noop) -> Session:
    """A session on trace `path` judged against its recorded values, or, given `reference`, against the
    same units on that trusted target (computed once and kept in the cache: engine/reference.py)."""
    if reference is None:
        return Session.open(path, spec, cache_dir=cache_dir, start_workers=start_workers, searching=searching)

    def open_reference(trace, reference_spec: TargetSpec) -> Session:
        return Session.open(trace, reference_spec, cache_dir=cache_dir, start_workers=True)

    try:
        against = trusted_target(path, reference, cache_dir, open_reference, progress)
    except TargetError as exc:
        raise TargetError(f"reference target: {exc}") from exc
    return Session(TraceReader(against.trace), spec, cache_dir=cache_dir, start_workers=start_workers,
                   searching=searching, against=against)
