"""The replay engine's state: one trace, one target, its kept ops, and the collaborators that do
the jobs (the position is the `stops.Debugger`'s).

Like `bdb`, it knows nothing of terminals: every method returns result objects and reports
progress through a callback. The session opens the parts and hands each collaborator the few it
uses, typed; none is handed the session, so none reaches back into it (docs/architecture.md, "The
session and its collaborators"): `TraceOps` (the ops read once, their recorded values),
`RequestBuilder` (units and where their inputs come from), `Runtime` (the worker processes that
compile and run them, and how: a crash inside TVM becomes a verdict, not the end of the session),
`KeptOps` (the kept set by origin), `TargetChains` (chains of per-op kernels, the propagated series:
`session.chains`), `PropagatedReplay` (the offload set and the replay's target values:
`session.replay`), `Verdicts` (the verdict rule, the isolated-verdict cache, the tolerance policy:
`session.verdicts`), `MixedRunner` (mixed runs), `Migration`, `compile_check` (codegen only).
`Bisection` (the search) still takes the session: its phases are being narrowed the same way.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Callable

from tapml_dbg.engine.compile_check import compile_all
from tapml_dbg.engine.kept import KeptOps, host_only_of, parse_kept, with_node_groups
from tapml_dbg.engine.migrate import MigrateResult, Migration
from tapml_dbg.engine.mixed import MixedRun, MixedRunner
from tapml_dbg.engine.reference import FAILED_RUN_VERDICTS, RecordedSource, Reference, attributed, trusted_target
from tapml_dbg.engine.references import SourceReference, load_source_graph
from tapml_dbg.engine.propagation import PropagatedReplay, TargetChains
from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.results import BisectResult, CompileReport, StepResult
from tapml_dbg.engine.search import Bisection
from tapml_dbg.engine.trace_ops import TraceOps
from tapml_dbg.engine.verdicts import Verdicts
from tapml_dbg.errors import TargetError
from tapml_dbg.judge.compare import TolerancePolicy
from tapml_dbg.judge.verdict import Verdict
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.serialize import function_from_json
from tapml_dbg.runtime.scheduler import (DEFAULT_CACHE_DIR, Runtime, check_setup, transform_identity,
                                         transform_retyped, warm_up_torch)
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.trace import TraceReader

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


class Forgetting:
    """Who is told what the session forgot (`Session.observers`): "transform" (the pass's file was
    edited: verdicts and target values are the old text's), "reset" (back to op 0). A front end's own
    state (a debugger's verdicts seen, its position) follows from there. Held weakly: a debugger
    that is gone is not kept alive by the session it watched."""

    def __init__(self):
        self._observers: list[weakref.WeakMethod] = []

    def observe(self, forgot: Callable[[str], None]) -> None:
        """Call the bound method `forgot(what)` whenever the session forgets computed state."""
        self._observers.append(weakref.WeakMethod(forgot))

    def tell(self, what: str) -> None:
        alive = [ref for ref in self._observers if ref() is not None]
        self._observers = alive
        for ref in alive:
            forgot = ref()
            if forgot is not None:
                forgot(what)


class Session:
    """One replay of one trace on one target: its state, and the collaborators that do the jobs,
    each made of the few parts it uses (none is handed the session)."""

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
        self.observers = Forgetting()  # told what the session forgot (a debugger: engine/stops.py)
        # one lane per free tracker server (or --parallel N); lane 0 also does the sequential work
        self.target, self.where = self.spec.target, self.spec.where  # where: "cuda via rpc HOST:PORT"
        self.lanes = Runtime.open(reader.path, self.spec, cache_dir, start_workers=start_workers,
                                  searching=searching)
        self.pool = self.lanes.pool
        try:
            check_setup(self.spec)  # fail early on a bad target string or FILE.py:FUNC
            reader.weights.require()  # a referenced checkpoint file missing or changed: one line, before any unit runs
            graph = reader.outline.graph()
            main, ops = function_from_json(graph), [OpInfo.from_json(op) for op in reader.outline.ops]
            # the jobs, each given what it uses: the live source reference (float64 references, undefined values,
            # type changes: engine/references.py), the requests, the trace's ops read once, the kept ops, chains of
            # per-op kernels, the propagated replay, the verdicts, mixed runs
            self.reference = SourceReference(reader, ops, main, load_source_graph(reader))
            self.requests = RequestBuilder(reader, main, ops, self.reference.replay_casts(transform_retyped(self.spec)),
                                           graph)
            trace = self.trace_ops = TraceOps(reader, main, ops, self.requests.recorded)
            self.main, self.ops, self.by_name, self.op_table = main, ops, trace.by_name, trace.op_table
            self.consumers, self.dead_fields, self.recorded = trace.consumers, trace.dead_fields, trace.recorded
            self.source_values = trace.source_values  # an op's recorded values (TraceError: what to record)
            self.input_names, self.param_names = self.requests.input_names, self.requests.param_names
            self.kept_ops = _kept_ops(trace, self.reader, self.against)
            # the kept set's parts for the session's readers, as of the last `set_kept` (which alone changes
            # the kept set); the collaborators share `kept_ops` itself (engine/kept.py)
            self.host_only, self.host_only_ops = self.kept_ops.host_only, self.kept_ops.host_only_ops
            self.user_kept, self.kept = self.kept_ops.user, self.kept_ops.all
            self.chains = TargetChains(trace, self.requests, self.lanes, self.kept_ops)
            self.replay = PropagatedReplay(trace, self.chains, self.kept_ops)
            self.verdicts = Verdicts(trace, self.reference, self.requests, self.lanes, self.replay, self.kept_ops,
                                     policy or TolerancePolicy())
            self.isolated_verdicts = self.verdicts.isolated_verdicts
            self.mixed_runner = MixedRunner(trace, self.reference, self.chains, self.verdicts, self.where)
        except BaseException:
            self.lanes.close()
            raise
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
        self.mixed_runner.close()  # a TVM-source trace's source target runtime, where a mixed run opened it
        self.lanes.close()
        self.reader.close()
        if self._torch_import is not None:
            self._torch_import.join()  # an import cut short by the interpreter's exit can crash it

    # ---------------------------------------------------------------- state
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
        self.observers.tell("transform")
        return (f"{self.spec.transform} changed since the last command: verdicts and target values "
                "are recomputed under its new text (the compile cache rebuilds only the units it changes)")

    def reset(self) -> None:
        """Back to op 0 with every op offloaded and no target values."""
        self.replay.reset()
        self.isolated_verdicts.clear()
        self.observers.tell("reset")

    # ---------------------------------------------------------------- kept ops (engine/kept.py)
    def set_kept(self, indices) -> list[int]:
        """Keep these ops on the source (a known bug, or one assumed fixed), with the other bindings of
        their source ops: cut out of the target's units, no verdict named. Replaces the kept set."""
        self.user_kept = self.kept_ops.keep_user(indices)
        self.kept = self.kept_ops.all
        self.replay.forget()
        return sorted(self.user_kept)

    def keep(self, text: str) -> list[int]:
        """`--keep OPS`, the REPL's `keep OPS`: op selectors (`14,37`, `cumsum`, a layer) or `none`."""
        return self.set_kept(parse_kept(self.op_table, text))

    # ---------------------------------------------------------------- lookup
    # one set of selector rules for the whole tool: see tapml_dbg.model.select (`op_table`: layers too)
    def resolve(self, text: str | int) -> OpInfo:
        """One op by index (`12`, `#12`, `-1`) or name; the error suggests close names."""
        return self.ops[self.op_table.op(text)]

    def resolve_ops(self, text: str) -> list[int]:
        """Comma-separated ops, ranges `a:b` and layers: the union, sorted."""
        return self.op_table.select_many(text)

    # ---------------------------------------------------------------- verdicts (engine/verdicts.py)
    def isolated(self, index: int) -> Verdict:
        """The op alone, fed recorded source inputs: is this kernel wrong? (A host-only op: no verdict.)"""
        return self.verdicts.isolated(index)

    def step_result(self, index: int, isolated: Verdict | None = None, propagated: Verdict | None = None) -> StepResult:
        op = self.ops[index]
        return StepResult(op.index, op.name, op.op, op.layer, isolated, propagated, step=op.step)

    def compare(self, index: int) -> StepResult:
        """Both verdicts of one op, side by side (the propagated one: `Verdicts.propagated`)."""
        return self.step_result(index, self.verdicts.isolated(index), self.verdicts.propagated(index))

    # ---------------------------------------------------------------- running
    def run_op(self, index: int) -> StepResult:
        """Op `index` run on the target with both verdicts (a kept op runs on the source: none)."""
        return self.step_result(index) if index in self.kept else self.compare(index)

    def bisect(self, sweep: bool = True, progress: Progress = _noop) -> BisectResult:
        """Find the first divergent op (the phases: `engine.search.Bisection`), told what it was judged
        against (engine/reference.py `attributed`)."""
        edited = self.notice_transform_edit()
        result = Bisection(self, sweep, progress).run()
        if edited:
            result.notes.insert(0, edited)
        return attributed(result, self.against)

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
        return Migration(self.mixed_runner, self.verdicts, by, one_at_a_time, progress).run()

    def compile_all(self, progress: Progress = _noop) -> CompileReport:
        """Compile every op for the target without running it; failures become verdicts."""
        return compile_all(self.chains, self.target, progress)


def _kept_ops(trace: TraceOps, reader: TraceReader, against: Reference) -> KeptOps:
    """Ops kept on the source always: those TVM cannot import, run on the host in every replay, and
    the TVM-wide ops a reference target cannot build or run either, so that a search against a
    reference target never stops at a bug every TVM target shares (engine/reference.py)."""
    reference_kept = with_node_groups(trace.ops, [op.index for op in against.tvm_wide
                                                  if op.verdict in FAILED_RUN_VERDICTS])
    return KeptOps(trace.ops, host_only_of(trace.main, trace.ops, reader.meta), reference_kept)


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
