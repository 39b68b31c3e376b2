"""Where a worker's unit libraries come from: the one a compile lane named, a key another worker of
the session computed (the key ledger), the compile cache, a build of several units into one library
(`compile_cache.build_together`), or a compile of the unit alone. `runtime/worker.py` asks here
before it runs a unit; a compile lane's and a builder's requests are answered here whole."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path

from tapml_dbg.errors import TapmlError
from tapml_dbg.portable import PortableError, TransformFailed, one_line
from tapml_dbg.runtime.compile_cache import (TOGETHER_KINDS, TOGETHER_MAX_UNITS, CacheEntry, CompiledUnit, KeyLedger,
                                             build_together, compile_only, compile_unit, environment_scope,
                                             library_key, transform_identity, unit_id)
from tapml_dbg.runtime.messages import (BuildRequest, BuildResult, CompileRequest, CompileResult, UnitRequest,
                                       UnitStatus, WorkerConfig)
from tapml_dbg.runtime.target import parse_target

TOGETHER_LOOKAHEAD_UNITS = 128  # how far a chain looks ahead for units to build together with the one it lacks


class Libraries:
    """One worker's units' libraries. `meanwhile`: what may run while it waits for a build (a chain's
    read-ahead: `trace/read_ahead.py`), set by the worker while a chain or batch runs."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.ledger = KeyLedger(config.ledger_path, environment_scope(os.environ)) if config.ledger_path else None
        self.known: dict[str, CompiledUnit] = {}  # unit id -> its library, found in this request
        self.identity: str | None = None  # the transform's, read once a request
        self.looked_ahead = 0  # the chain's units up to here were considered for building together
        self.together: set[str] = set()  # keys built together by this worker, not yet reported as compiled
        self.meanwhile = nullcontext

    def begin_request(self) -> None:
        """A new request: what the last one found is looked up again (a chain runs a kind of op many times)."""
        self.known = {}
        self.identity = None
        self.looked_ahead = 0

    def compile(self, request: CompileRequest) -> CompileResult:
        """Compile a unit into the cache (or generate its code only), without running it."""
        compiled = self.library(request.unit, request.ahead, request.code_only)
        return compiled if isinstance(compiled, CompileResult) else self.built(compiled)

    def library(self, unit: UnitRequest, ahead: bool = False, code_only: bool = False) -> CompiledUnit | CompileResult:
        """The unit's library; or why it has none (its result): the user's transform raised, it did
        not compile, or only its code was asked for."""
        spec = self.config.spec
        try:
            if code_only:
                compile_only(unit.unit_json, spec.target, spec.transform)  # raises without device code
                return CompileResult(UnitStatus.OK)
            return self.compiled(unit, ahead=ahead)
        except TransformFailed as exc:  # the user's pass raised: theirs to fix, not the op's verdict
            ops = f"op {', '.join(unit.outputs)}: " if unit.outputs else ""
            return CompileResult(UnitStatus.TRANSFORM_ERROR, message=f"{ops}{exc}")
        except (TapmlError, PortableError) as exc:
            return CompileResult(UnitStatus.COMPILE_ERROR, message=str(exc))
        except Exception as exc:
            return CompileResult(UnitStatus.COMPILE_ERROR, message=one_line(exc))

    def built(self, compiled: CompiledUnit) -> CompileResult:
        """A unit's library as its result says it: a unit left to the worker building it is not one
        this request compiled; one built together with others is, the first time a request meets it."""
        built_together = compiled.key in self.together
        self.together.discard(compiled.key)
        return CompileResult(UnitStatus.OK, cached=(compiled.cached or compiled.elsewhere) and not built_together,
                             key=compiled.key, library=str(compiled.path))

    def compiled(self, request: UnitRequest, rebuild: bool = False, build: bool = True,
                  ahead: bool = False) -> CompiledUnit:
        """The unit's library: the one a compile lane named, or whose key another worker of the
        session computed (the ledger), else from (or into) the cache (`build=False`: not into it;
        `ahead`: not waiting for a key another worker is building; `compile_unit`)."""
        if request.library and not rebuild and Path(request.library).is_file():
            return CompiledUnit(Path(request.library), True)
        spec, cache_dir = self.config.spec, Path(self.config.cache_dir)
        fetch = partial(compile_unit, request.unit_json, spec.target, spec.transform, cache_dir, rebuild=rebuild,
                        meanwhile=self.meanwhile,
                        wait=not ahead, build=build)
        if self.ledger is None:
            return fetch()
        if self.identity is None:
            self.identity = transform_identity(spec.transform)
        identity, unit = self.identity, request.unit_id or unit_id(request.unit_json, spec.transform)
        if unit in self.known and not rebuild:
            return self.known[unit]
        key = None if rebuild else self.ledger.get(identity, unit)
        if key:  # keyed by another worker: no need to run the transform again
            entry = CacheEntry(cache_dir, key)
            if entry.valid():
                self.known[unit] = CompiledUnit(entry.library, True, key)
                return self.known[unit]
            if not build:  # its library is not there yet
                return CompiledUnit(entry.library, False, key, elsewhere=True)
        compiled = fetch()
        if transform_identity(spec.transform) == identity:  # the pass's text did not change meanwhile
            self.ledger.add(identity, unit, compiled.key)
            if not compiled.elsewhere:
                self.known[unit] = CompiledUnit(compiled.path, True, compiled.key)
        return compiled

    def build(self, request: BuildRequest) -> BuildResult:
        """A builder's units into the cache: together where they can be, the rest one by one (a key
        another worker is building is left to it)."""
        keys = []
        for position, unit in enumerate(request.units):
            self.build_together(request.units, position)
            reply = self.compile(CompileRequest.of(unit, ahead=True))
            if reply.key:
                keys.append((reply.key, reply.cached))
        return BuildResult(UnitStatus.OK, unit_keys=keys)

    def build_together(self, units: list[UnitRequest], position: int) -> None:
        """When the unit at `position` is not in the cache, it and the next ones the cache lacks are
        built into one library (`compile_cache.build_together`: one code generation and one link for
        up to TOGETHER_MAX_UNITS units), on a local host target; what that leaves out is built one
        by one as before. Looked at once per stretch of TOGETHER_LOOKAHEAD_UNITS units."""
        spec = self.config.spec
        if position < self.looked_ahead or spec.rpc or spec.tracker or units[position].library \
                or parse_target(spec.target).kind.name not in TOGETHER_KINDS:
            return
        try:
            if not self.compiled(units[position], build=False).elsewhere:
                return
            lacking, keys = [], set()
            end = min(len(units), position + TOGETHER_LOOKAHEAD_UNITS)
            for later in range(position, end):
                unit = units[later]
                compiled = None if unit.library else self.compiled(unit, build=False)
                if compiled is not None and compiled.elsewhere and compiled.key not in keys:
                    keys.add(compiled.key)
                    lacking.append(unit.unit_json)
                    if len(lacking) >= TOGETHER_MAX_UNITS:
                        end = later + 1
                        break
        except Exception:  # noqa: BLE001 - a unit that cannot be keyed: its own run reports it
            return
        self.looked_ahead = end
        if len(lacking) > 1:
            with self.meanwhile():
                self.together |= build_together(lacking, spec.target, spec.transform, Path(self.config.cache_dir))

    def built_or_none(self, unit: UnitRequest) -> UnitRequest | None:
        """The unit with its library named, when the cache holds it; None when it is not built yet.
        A unit that cannot even be keyed (a broken transform) runs as usual: its run reports it."""
        try:
            compiled = self.compiled(unit, build=False)
        except Exception:  # noqa: BLE001 - the unit's own run says what is wrong, as without deferring
            return unit
        return None if compiled.elsewhere else replace(unit, library=str(compiled.path))

    def key(self, unit: UnitRequest) -> str:
        """The unit's cache key without building it ("" when it cannot be keyed: its run says why)."""
        if unit.library and Path(unit.library).is_file():
            return library_key(unit.library)
        try:
            return self.compiled(unit, build=False).key
        except Exception:  # noqa: BLE001 - a broken transform: the unit's own run reports it
            return ""
