"""The target worker: a child process that compiles and runs units, so TVM crashes stay there.

It reads recorded tensors straight from the trace (read-only) and keeps params on the
device, so the session sends it only names and the few arrays it computed itself. Building,
the device (local or over RPC), loading and running are portable's `Runner`: what a repro runs.
"""

from __future__ import annotations

from tapml_dbg.runtime.tvm_import import import_tvm_without_torch

if __name__ == "__main__":  # a worker process: it never uses torch (starts in ~0.8 s instead of ~2.4)
    import_tvm_without_torch()

import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import psutil

from tapml_dbg.errors import TapmlError, TraceError
from tapml_dbg.portable import PortableError, Runner, flatten, one_line
from tapml_dbg.portable.screen import clearly_passes, clearly_passes_each
from tapml_dbg.runtime.chain_log import ChainLogWriter
from tapml_dbg.runtime.compile_cache import CompiledUnit, kernel_store, library_key, load_transform
from tapml_dbg.runtime.libraries import Libraries
from tapml_dbg.runtime.messages import (AnyResult, BatchRequest, BatchResult, BuildRequest, ChainRequest, ChainResult,
                                       CompileRequest, CompileResult, Request, UnitRequest, UnitResult, UnitStatus,
                                       WorkerConfig, WorkerReply)
from tapml_dbg.runtime.run_memo import ACCEPTED, SCREENED, UNSCREENED, RunMemo, checkpoint_positions
from tapml_dbg.runtime.target import NO_DEVICE_HINT, parse_target
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.read_ahead import ReadAhead
from tapml_dbg.trace.recent import RecentOpOutputs

RECORDED_CACHE_BYTES = 64 * 2**20  # recorded op outputs a worker keeps (LRU) for its next units
READ_AHEAD_BYTES = 256 * 2**20  # params and recorded values a chain's worker reads ahead while it waits


def worker_main(conn, config: WorkerConfig, log_path: str | None = None) -> None:
    """Serve requests until told to stop or the pipe closes."""
    if log_path:
        _redirect_native_output(log_path)
    if config.niceness:
        os.nice(config.niceness)
    state = _WorkerState(config)
    state.warm_up()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        conn.send(WorkerReply(state.handle(message), own_rss()))


def own_rss() -> int | None:
    """This worker's resident memory in bytes, sent with each reply (the executor replaces a worker
    that has grown too much; asked here, it costs the session nothing)."""
    global _SELF
    try:
        if _SELF is None or _SELF.pid != os.getpid():  # (a fork's parent's is not this process)
            _SELF = psutil.Process()
        return _SELF.memory_info().rss
    except psutil.Error:
        return None


_SELF = None  # this process, for own_rss


def _redirect_native_output(log_path: str) -> None:
    """TVM's C++ warnings go to fd 1/2; keep them in a log the session can quote after a crash."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)


class _WorkerState:
    """One trace on one target: a portable `Runner` (device, RPC session, loaded libraries) and the
    params already on the device."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.reader = None
        self.op_index: dict[str, int] = {}
        self.param_cache: dict[str, object] = {}
        self.runner: Runner | None = None  # made on the first unit that runs
        self.chain_values: dict[str, list] = {}  # op name -> its device tensors, while a chain runs
        self.recorded: RecentOpOutputs | None = None  # the trace's op outputs, the last ones read kept
        self.read_ahead: ReadAhead | None = None  # while a chain runs: what it will read, read while it waits
        self.libraries = Libraries(config)  # where each unit's library comes from
        self.memo: RunMemo | None | bool = False  # False: not opened yet (`_memo`)
        self.isolated_cleared: list[str] = []  # the running chain's ops whose values cleared the isolated screen

    def warm_up(self) -> None:
        """What every worker's first unit pays, paid before it is asked for one (workers start
        while the session opens): the target, the user's transform. A failure is left to that
        first unit to report."""
        try:
            parse_target(self.config.spec.target)
            load_transform(self.config.spec.transform)
        except Exception:  # noqa: BLE001 - reported by the first unit, as without the warm-up
            pass

    def handle(self, request: Request) -> AnyResult:
        self.libraries.begin_request()
        if isinstance(request, ChainRequest):
            return self._chain(request)
        if isinstance(request, BatchRequest):
            return self._batch(request)
        if isinstance(request, BuildRequest):
            return self.libraries.build(request)
        if isinstance(request, CompileRequest):
            return self.libraries.compile(request)
        return self._unit(request)

    # -- a chain: units fed one another's values on the device ----------------------------
    def _chain(self, chain: ChainRequest) -> ChainResult:
        """Each unit in turn, fed the earlier units' outputs on the device; the kept ones come back
        (a screening chain: it stops at the first suspect, see `ChainRequest`).

        With the trace's memo (runtime/run_memo.py), a screening chain starts from its latest
        checkpoint whose digest matches, and saves checkpoints of its own while every value so far
        cleared."""
        self.chain_values = {}
        screen = chain.screen
        log = ChainLogWriter(screen.log if screen is not None and screen.isolated_rule is not None else "")
        self.isolated_cleared = []
        try:
            self._trace()  # open here: the read-ahead's plan only looks things up in it
            memo = self._memo() if screen is not None else None
            found = _ChainFound(set(chain.keep))
            start, digest = 0, ""
            if memo is not None:
                memo.begin_request()  # what its search recorded is no earlier run's
                memo.start_chain()
                start, digest = self._resume(chain, memo, found.keys)
                found.earlier = start if start and memo.earlier(digest) else 0  # not this process's own
                if start and log.fd is not None:
                    self._log_resumed(chain, memo, digest, start, log)
            self._read_ahead_for(chain.names, chain.units, _screened(chain), start)
            return self._chain_from(chain, start, digest, memo, log, found)
        except TraceError as exc:  # a corrupt recorded value the screen read: the trace's own message
            return ChainResult(UnitStatus.TRACE_ERROR, message=str(exc))
        finally:
            log.close()
            self.chain_values = {}
            self._stop_read_ahead()

    def _chain_from(self, chain: ChainRequest, start: int, digest: str, memo: RunMemo | None, log: ChainLogWriter,
                    found: "_ChainFound") -> ChainResult:
        """The chain's units from `start` on (the ones before: a checkpoint's values), `digest` the
        memo's digest there."""
        last_read = _last_reads(chain)
        last_use = _last_uses(chain, last_read)
        checkpoints = checkpoint_positions(len(chain.units)) if memo is not None else ()
        for position in range(start, len(chain.units)):
            name, unit = chain.names[position], chain.units[position]
            if position in checkpoints and position > start and not found.suspects:
                self._save_checkpoint(memo, digest, position, last_read, chain.screen.isolated_rule)
            if self.config.together:
                self.libraries.build_together(chain.units, position)
            reply = self._unit(unit, keep_on_device=True, sync=chain.sync_each)
            if not reply.ok:
                return found.failed(chain, name, reply)
            found.keys.append((reply.key, reply.cached))
            self.chain_values[name] = reply.outputs[0]
            if checkpoints:
                digest = memo.step(digest, name, _key_of(reply), unit.inputs, _treated(chain, name))
            if self._keep(chain, name, unit, reply, log, found):  # its last suspect
                break
            for done in last_use.pop(position, ()):  # no later unit reads it: free the device memory
                self.chain_values.pop(done, None)
        return found.result(chain, self.read_ahead.read_ahead)

    def _keep(self, chain: ChainRequest, name: str, unit: UnitRequest, reply: UnitResult, log: ChainLogWriter,
              found: "_ChainFound") -> bool:
        """What of a chain unit's values comes back (screened, a suspect's; else a kept op's); True
        when it is the chain's last suspect."""
        screen = chain.screen
        if screen is not None and name not in screen.accept:
            values = [value.numpy() for value in reply.outputs[0]]
            if name in screen.unscreened or not self._clear(name, values, screen.rule, log, screen.isolated_rule):
                log.write(name, False)
                found.suspects.append(name)
                found.kept[name] = values
                found.upstream[name] = {ref[1]: [value.numpy() for value in self.chain_values[ref[1]]]
                                        for ref in unit.inputs if ref[0] == "chain"}
                if len(found.suspects) >= screen.suspects:
                    return True
        elif name in found.wanted:
            found.kept[name] = [value.numpy() for value in reply.outputs[0]]
        if screen is not None and name in screen.accept:  # judged elsewhere: not cleared here
            log.write(name, False)
        if screen is not None and name in screen.also_keep:
            found.also_kept[name] = [value.numpy() for value in reply.outputs[0]]
        return False

    # -- a batch: units alone, each fed recorded values -----------------------------------
    def _batch(self, batch: BatchRequest) -> BatchResult:
        """Each unit alone on recorded values, its value screened as it comes: only suspects come
        back (`BatchRequest`). With the trace's memo (runtime/run_memo.py), a unit an earlier run
        cleared is not run again."""
        try:
            self._trace()  # open here: the read-ahead's plan only looks things up in it
            memo = self._memo()
            remembered: dict[str, tuple[str, str]] = {}
            earlier = 0  # units not run thanks to an earlier run's records (not this process's own)
            if memo is not None:
                memo.begin_request()  # what its search recorded is no earlier run's
                remembered = self._remembered(batch, memo)
                earlier = sum(memo.earlier(unit_digest) for _key, unit_digest in remembered.values())
            self._read_ahead_for(batch.names, batch.units, set(batch.names) - batch.unscreened, 0, set(remembered))
            return self._batch_units(batch, memo, remembered, earlier)
        except TraceError as exc:  # a corrupt recorded value the screen read: the trace's own message
            return BatchResult(UnitStatus.TRACE_ERROR, message=str(exc))
        finally:
            self._stop_read_ahead()

    def _batch_units(self, batch: BatchRequest, memo: RunMemo | None, remembered: dict[str, tuple[str, str]],
                     earlier: int) -> BatchResult:
        keys: list[tuple[str, bool]] = []  # each unit's cache key, and whether it came from the cache
        suspects, deferred, kept = [], [], {}  # (deferred: units not built yet, skipped: `defer_unbuilt`)
        for position, (name, unit) in enumerate(zip(batch.names, batch.units)):
            if name in remembered:  # an earlier run cleared this very unit
                keys.append((remembered[name][0], True))
                continue
            if batch.defer_unbuilt:
                unit = self.libraries.built_or_none(unit)
                if unit is None:
                    deferred.append(name)
                    continue
            elif self.config.together:
                self.libraries.build_together(batch.units, position)
            reply = self._unit(unit, keep_on_device=True)
            if reply.status in (UnitStatus.TRACE_ERROR, UnitStatus.TRANSFORM_ERROR):  # its own one line
                return BatchResult(reply.status, message=reply.message)
            if not reply.ok:  # what ran before it comes back too
                return BatchResult(reply.status, message=f"op {name}: {reply.message}", failed_op=name,
                                   outputs=[kept[name] for name in suspects], suspects=suspects, deferred=deferred,
                                   unit_keys=keys, remembered=earlier)
            keys.append((reply.key, reply.cached))
            values = [value.numpy() for value in reply.outputs[0]]
            if name in batch.unscreened or not self._clear(name, values, batch.rule):
                suspects.append(name)
                kept[name] = values
                if len(suspects) >= batch.suspects:
                    break
            elif memo is not None and (key := _key_of(reply)):
                memo.add_cleared(memo.unit_digest(name, key, unit.inputs, batch.rule))
        return BatchResult(UnitStatus.OK, outputs=[kept[name] for name in suspects], suspects=suspects,
                           deferred=deferred, unit_keys=keys, remembered=earlier)

    def _read_ahead_for(self, names: list[str], units: list[UnitRequest], screened: set[str], start: int = 0,
                        skipped: set[str] = frozenset()) -> None:
        self.read_ahead = ReadAhead(partial(self._reads_of, names, units, screened, start, skipped), READ_AHEAD_BYTES)
        self.libraries.meanwhile = self.read_ahead.meanwhile  # a chain's worker reads while it waits for a build

    def _stop_read_ahead(self) -> None:
        if self.read_ahead is not None:
            self.read_ahead.close()
            self.read_ahead = None
        self.libraries.meanwhile = nullcontext

    # -- the memo (runtime/run_memo.py) -----------------------------------------------------
    def _memo(self) -> RunMemo | None:
        if self.memo is False:
            self.memo = RunMemo.open(self.config.cache_dir, self.config.trace_path, self.config.spec)
        return self.memo

    def _remembered(self, batch: BatchRequest, memo: RunMemo) -> dict[str, tuple[str, str]]:
        """The batch's units a run before cleared: op name -> (its key, its memo digest)."""
        found = {}
        if not memo.any_cleared():  # nothing to look up: no unit keyed for it
            return found
        for name, unit in zip(batch.names, batch.units):
            if name in batch.unscreened:
                continue
            key = self.libraries.key(unit)
            digest = memo.unit_digest(name, key, unit.inputs, batch.rule) if key else ""
            if key and memo.cleared(digest):
                found[name] = (key, digest)
        return found

    def _resume(self, chain: ChainRequest, memo: RunMemo, keys: list) -> tuple[int, str]:
        """Where the chain starts: the latest position whose digest has a checkpoint (its values put
        on the device, the units before it keyed into `keys`), else 0; and the digest there."""
        digest = first = memo.chain_digest(chain.screen.rule)
        if not memo.any_checkpoint():
            return 0, first
        wanted = set(chain.keep) | set(chain.screen.also_keep)  # values only a run of their unit gives
        found: list[tuple[int, str, int]] = []  # (position, digest, units before it) with a checkpoint
        prefix: list[tuple[str, bool]] = []
        for position, (name, unit) in enumerate(zip(chain.names, chain.units)):
            if position and memo.has_checkpoint(digest):
                found.append((position, digest, len(prefix)))
            key = self.libraries.key(unit) if name not in wanted else ""
            if not key:
                break
            prefix.append((key, True))
            digest = memo.step(digest, name, key, unit.inputs, _treated(chain, name))
        for start, digest, count in reversed(found):  # the latest that reads back (a damaged one is removed)
            values = memo.load(digest)
            needed = {ref[1] for unit in chain.units[start:] for ref in unit.inputs if ref[0] == "chain"}
            if values is None or not (needed & set(chain.names[:start])) <= set(values):
                continue
            runner = self._runner()
            self.chain_values = {name: [runner.to_device(value) for value in arrays]
                                 for name, arrays in values.items()}
            keys.extend(prefix[:count])
            return start, digest
        return 0, first

    def _save_checkpoint(self, memo: RunMemo, digest: str, position: int, last_read: dict[str, int],
                         isolated_rule) -> None:
        """The values units from `position` on read, saved under the digest of the units before it
        (once: a chain run again, the tokens phase's, finds it there), with the ops before it whose
        values cleared the isolated screen when the chain checks that one (`ChainScreen.log`)."""
        if memo.has_checkpoint(digest):
            return
        live = {name: [value.numpy() for value in tensors] for name, tensors in self.chain_values.items()
                if last_read.get(name, -1) >= position}
        cleared = (repr(isolated_rule), list(self.isolated_cleared)) if isolated_rule is not None else None
        memo.save(digest, live, cleared)

    def _log_resumed(self, chain: ChainRequest, memo: RunMemo, digest: str, start: int, log: ChainLogWriter) -> None:
        """A chain started from a checkpoint: the units before it, in the log as the chain that saved it
        found them (not cleared by the isolated screen where it did not say)."""
        cleared = set(memo.cleared_before(digest, repr(chain.screen.isolated_rule)) or ())
        for name in chain.names[:start]:
            log.write(name, name in cleared)
            if name in cleared:
                self.isolated_cleared.append(name)

    def _reads_of(self, names: list[str], units: list[UnitRequest], screened: set[str], start: int = 0,
                  skipped: set[str] = frozenset()) -> list:
        """What a chain or batch will still read from the trace, in its order: the params and
        recorded inputs its units from `start` on are fed (but those of `skipped`), the recorded
        values it screens their outputs against (those of `screened`; not those it holds already)."""
        reader = self._trace()
        reads: dict = {}

        def recorded(op_name: str) -> None:
            index = self.op_index.get(op_name)
            if index is not None and index not in self.recorded:
                reads.setdefault(("op", index), partial(_recorded_or_none, reader, index))

        for name, unit in zip(names[start:], units[start:]):
            if name in skipped:
                continue
            for ref in unit.inputs:
                if ref[0] == "param" and ref[1] not in self.param_cache:
                    reads.setdefault(("param", ref[1]), partial(reader.tensors.param, ref[1]))
                elif ref[0] == "op":
                    recorded(ref[1])
            if name in screened:
                recorded(name)
        return list(reads.items())

    def _recorded(self, index: int) -> list:
        """Op `index`'s recorded values: kept, read ahead, or read now."""
        if self.read_ahead is not None and index not in self.recorded:
            values = self.read_ahead.take(("op", index))
            if values is not None:
                self.recorded.keep(index, values)
                return values
        return self.recorded.get(index)

    def _clear(self, name: str, values: list, rule, log: ChainLogWriter | None = None, isolated=None) -> bool:
        """Whether op `name`'s target values clearly pass against its recorded ones (judge/screen.py).
        With a `log` (a chain's): a value that does is logged, cleared when it passes `isolated` too."""
        reader = self._trace()
        index = self.op_index.get(name)
        if index is None or (index not in self.recorded and not reader.recorded.has_op(index)):
            return False
        if log is None or log.fd is None:
            return clearly_passes(values, self._recorded(index), rule)
        passed, alone = clearly_passes_each(values, self._recorded(index), (rule, isolated))
        if passed:
            log.write(name, alone)
            if alone:
                self.isolated_cleared.append(name)
        return passed

    def _unit(self, request: UnitRequest, keep_on_device: bool = False, sync: bool = False) -> UnitResult:
        """Compile (or load) and run one unit. `sync`: wait for the device before replying, so that an
        asynchronous kernel fault is this unit's error (a chain kept on the device runs on otherwise)."""
        spec = self.config.spec
        compiled = self.libraries.library(request)
        if isinstance(compiled, CompileResult):
            return UnitResult(compiled.status, message=compiled.message)
        built = self.libraries.built(compiled)
        try:
            runner = self._runner()
            runner.device()
        except (TapmlError, PortableError) as exc:
            return UnitResult(UnitStatus.TARGET_LOST, message=str(exc))
        try:
            vm = self._load(runner, request, compiled)
            args = [self._argument(ref) for ref in request.inputs]
            results = runner.invoke(vm, args)
            # one flat list per unit output (a chain keeps its values on the device)
            outputs = [(on_device(value) if keep_on_device else flatten(value)) for value in results]
            if sync:
                runner.device().sync()
        except TraceError as exc:  # a corrupt recorded value: the user's to know, not the op's verdict
            return UnitResult(UnitStatus.TRACE_ERROR, message=str(exc))
        except (TapmlError, PortableError) as exc:
            return UnitResult(UnitStatus.ERROR, message=str(exc))
        except Exception as exc:
            if runner.is_remote and (_looks_like_lost_connection(exc) or not runner.alive()):
                self._forget_remote()
                return UnitResult(UnitStatus.TARGET_LOST,
                                  message=f"lost the RPC connection to {spec.rpc or spec.tracker} ({one_line(exc)}); "
                                          "the next command reconnects once the server is back")
            return UnitResult(UnitStatus.ERROR, message=one_line(exc))
        return UnitResult(UnitStatus.OK, outputs=outputs, cached=built.cached, key=built.key, library=built.library)

    def _load(self, runner: Runner, request: UnitRequest, compiled: CompiledUnit):
        """Load the library; one that does not load (a damaged file under an intact record) is built again."""
        try:
            return runner.load(compiled.path)
        except Exception:
            if runner.is_remote and not runner.alive():
                raise
            return runner.load(self.libraries.compiled(request, rebuild=True).path)

    # -- the target ----------------------------------------------------------------------
    def _runner(self) -> Runner:
        if self.runner is None:
            spec = self.config.spec
            self.runner = Runner(spec.target, spec.rpc, spec.tracker, spec.key, no_device_hint=NO_DEVICE_HINT,
                                 kernel_store=kernel_store(self.config.cache_dir))
        return self.runner

    def _forget_remote(self) -> None:
        """The RPC session is gone: so are the libraries and params it held; the next unit reconnects."""
        self.runner.reset()
        self.param_cache.clear()

    # -- inputs ---------------------------------------------------------------------------
    def _trace(self):
        if self.reader is None:
            self.reader = TraceReader(self.config.trace_path)
            self.op_index = {op["name"]: op["index"] for op in self.reader.outline.ops}
            self.recorded = RecentOpOutputs(self.reader, RECORDED_CACHE_BYTES)
        return self.reader

    def _argument(self, ref: tuple):
        kind = ref[0]
        if kind == "param":
            if ref[1] not in self.param_cache:
                value = self.read_ahead.take(("param", ref[1])) if self.read_ahead is not None else None
                self.param_cache[ref[1]] = self.runner.to_device(value if value is not None
                                                                 else self._trace().tensors.param(ref[1]))
            return self.param_cache[ref[1]]
        if kind == "input":
            return self.runner.to_device(self._trace().tensors.input(ref[1]))
        if kind == "op":
            self._trace()
            values = self._recorded(self.op_index[ref[1]])
            return self.runner.to_device(values[max(ref[2], 0)])
        if kind == "value":
            return self.runner.to_device(ref[1])
        if kind == "chain":  # an earlier unit of the running chain computed it
            return self.chain_values[ref[1]][max(ref[2], 0)]
        raise ValueError(f"unknown input reference {kind}")


# what TVM's RPC errors say when the other side is gone (the worker also asks the server, to be sure)
_LOST_CONNECTION_MARKERS = ("RPCCode", "kShutdown", "Socket", "socket", "Connection", "connection", "Broken pipe")


def _recorded_or_none(reader, index: int):
    return reader.tensors.op_outputs(index) if reader.recorded.has_op(index) else None


def _screened(chain: ChainRequest) -> set[str]:
    """The chain's ops whose values it checks against their recorded ones (`ChainRequest.screen`)."""
    if chain.screen is None:
        return set()
    return set(chain.names) - chain.screen.accept - chain.screen.unscreened


@dataclass
class _ChainFound:
    """What a running chain has found so far (`_WorkerState._chain`), and its result."""

    wanted: set[str]  # the chain's `keep`
    keys: list[tuple[str, bool]] = field(default_factory=list)  # each unit's cache key, and whether it came from the cache
    kept: dict[str, list] = field(default_factory=dict)
    also_kept: dict[str, list] = field(default_factory=dict)
    suspects: list[str] = field(default_factory=list)
    upstream: dict[str, dict] = field(default_factory=dict)
    earlier: int = 0  # units not run thanks to an earlier run's checkpoint (not this process's own)

    def result(self, chain: ChainRequest, read_ahead: int) -> ChainResult:
        return ChainResult(UnitStatus.OK, outputs=self._returned(chain), suspects=self.suspects, upstream=self.upstream,
                           also_kept=self.also_kept, unit_keys=self.keys, read_ahead=read_ahead,
                           remembered=self.earlier)

    def failed(self, chain: ChainRequest, name: str, reply: UnitResult) -> ChainResult:
        """The chain ended at unit `name`, which failed: what ran before it comes back too (a trace's
        or a transform's error: its own one line only)."""
        if reply.status in (UnitStatus.TRACE_ERROR, UnitStatus.TRANSFORM_ERROR):
            return ChainResult(reply.status, message=reply.message)
        return ChainResult(reply.status, message=f"op {name}: {reply.message}", failed_op=name,
                           outputs=self._returned(chain), suspects=self.suspects, upstream=self.upstream,
                           unit_keys=self.keys, remembered=self.earlier)

    def _returned(self, chain: ChainRequest) -> list:
        """The values a chain hands back: its suspects' (a screening chain), else those of `keep` it
        computed, in `keep`'s order (a chain that failed: the ones before the failed unit)."""
        names = self.suspects if chain.screen is not None else [name for name in chain.keep if name in self.kept]
        return [self.kept[name] for name in names]


def _key_of(reply: UnitResult) -> str:
    """A unit's cache key: its reply's, else its library's name (`KEY.so`, a compile lane's build)."""
    return reply.key or (library_key(reply.library) if reply.library else "")


def _treated(chain: ChainRequest, name: str) -> str:
    """How a screening chain treats op `name` (part of the memo's digest: a checkpoint past an op
    screened then is no checkpoint for a chain that must stop at it)."""
    if name in chain.screen.accept:
        return ACCEPTED
    return UNSCREENED if name in chain.screen.unscreened else SCREENED


def _last_reads(chain: ChainRequest) -> dict[str, int]:
    """Chain value -> the last position whose unit reads it."""
    last: dict[str, int] = {}
    for position, unit in enumerate(chain.units):
        for ref in unit.inputs:
            if ref[0] == "chain":
                last[ref[1]] = position
    return last


def _last_uses(chain: ChainRequest, last_read: dict[str, int]) -> dict[int, list[str]]:
    """Unit position -> the chain values no unit after it reads (freed once it has run), so that a
    chain holds the model's live values, not all of them. `last_read`: `_last_reads(chain)`."""
    last = {name: position for position, name in enumerate(chain.names)} | last_read
    by_position: dict[int, list[str]] = {}
    for name, position in last.items():
        by_position.setdefault(position, []).append(name)
    return by_position


def on_device(value) -> list:
    """`portable.flatten` without the copy to numpy: a VM result as a flat list of device tensors."""
    if value is None:
        return []
    if hasattr(value, "numpy"):
        return [value]
    return [tensor for item in value for tensor in on_device(item)]


def _looks_like_lost_connection(exc: BaseException) -> bool:
    return any(marker in str(exc) for marker in _LOST_CONNECTION_MARKERS)


def serve(argv: list[str]) -> None:
    """`--fd N --config JSON --log PATH`: serve the socket on fd N, then leave (a fresh interpreter's
    entry point, and a worker the zygote forked: runtime/zygote.py)."""
    import argparse
    from multiprocessing.connection import Connection

    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--log")
    args = parser.parse_args(argv)
    worker_main(Connection(args.fd), WorkerConfig.from_json(args.config), args.log)
    _exit_now()


def _exit_now() -> None:
    """Leave without the interpreter's teardown (TVM's and CUDA's: 0.3-0.8 s a worker): nothing of a
    worker's outlives it but its log, flushed here, and its scratch folder, which the session removes."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


if __name__ == "__main__":
    serve(sys.argv[1:])
