"""What the engine and a target worker say to each other: a request, a result, its status."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
import numpy as np

from tapml_dbg import settings
from tapml_dbg.portable.screen import ScreenRule
from tapml_dbg.runtime.target import TargetSpec


class UnitStatus(StrEnum):
    """How a unit's compile and run ended (`target-lost`: the RPC connection dropped, no verdict;
    `trace-error`: a recorded value the unit reads is corrupt or unreadable, no verdict either;
    `transform-error`: the user's --transform raised on the unit, a bug of the pass, no verdict)."""

    OK = "ok"
    COMPILE_ERROR = "compile-error"
    ERROR = "error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    TARGET_LOST = "target-lost"
    TRACE_ERROR = "trace-error"
    TRANSFORM_ERROR = "transform-error"


# What can poison a worker's context (docs/reliability.md, "Sticky faults"): after one CUDA kernel
# faults, every later call in that process fails, so a result that ends so retires its worker and
# no verdict is taken from that process again (runtime/executor.py re-runs what it must).
POISONING_STATUSES = frozenset({UnitStatus.CRASH, UnitStatus.TIMEOUT})  # the worker died, or was killed
POISONING_PATTERNS = (  # an error whose message names a device runtime fault (matched case-insensitively)
    "CUDA Runtime Error", "CUDA error", "cudaError", "CUDA_ERROR", "misaligned address", "illegal memory access",
    "illegal instruction", "unspecified launch failure", "device-side assert", "VK_ERROR_DEVICE_LOST",
)
POISON_PATTERNS_ENV = settings.POISON_PATTERNS  # more patterns, separated by `|` (another backend's words)


def poisons_worker(status: UnitStatus, message: str = "") -> bool:
    """Whether a unit that ended so may have poisoned its process: a crash, a timeout, or an error
    (a failed run or load) whose message matches POISONING_PATTERNS or $TAPML_POISON_PATTERNS."""
    if status in POISONING_STATUSES:
        return True
    if status not in (UnitStatus.ERROR, UnitStatus.COMPILE_ERROR) or not message:
        return False
    extra = settings.value(POISON_PATTERNS_ENV)
    text = message.lower()
    return any(pattern.strip().lower() in text for pattern in (*POISONING_PATTERNS, *extra))


@dataclass
class WorkerConfig:
    """What a worker serves: one trace on one target, compiling through one cache."""

    trace_path: str
    spec: TargetSpec
    cache_dir: str = ""
    ledger_path: str = ""  # the session's KeyLedger (runtime/compile_cache.py); "": none
    niceness: int = 0  # added to the worker's niceness when it starts (a worker building ahead: idle cycles only)
    together: bool = True  # a chain or batch builds the units it lacks together (off where compile lanes build them)

    def to_json(self) -> str:
        return json.dumps({"trace_path": self.trace_path, "spec": self.spec.to_json(), "cache_dir": self.cache_dir,
                           "ledger_path": self.ledger_path, "niceness": self.niceness, "together": self.together})

    @classmethod
    def from_json(cls, text: str) -> "WorkerConfig":
        data = json.loads(text)
        return cls(data["trace_path"], TargetSpec.from_json(data["spec"]), data["cache_dir"],
                   data.get("ledger_path", ""), int(data.get("niceness", 0)), bool(data.get("together", True)))


@dataclass(frozen=True)
class UnitRequest:
    """Run one unit. Inputs are ("input"|"param", name), ("op", name, field) or ("value", array).

    `library`: the unit's library, already in the cache (a compile lane built it: `Pipeline`): load
    and run it without compiling. `unit_id`: its id in the compile cache's index and ledger, computed
    once in the session (`compile_cache.shared_units`; "": the worker computes it).
    """

    unit_json: dict
    inputs: list[tuple]
    outputs: list[str] = field(default_factory=list)
    library: str = ""
    unit_id: str = ""


@dataclass(frozen=True)
class CompileRequest:
    """Compile one unit without running it: into the cache, the result saying where its library is
    (what a compile lane does), or, `code_only`, generate its code only: no cache, no device
    (`tapml-dbg compile`). `ahead`: a key another worker is building is left to that worker (the
    result has the key, no library yet) instead of waited for."""

    unit: UnitRequest
    ahead: bool = False
    code_only: bool = False

    @classmethod
    def of(cls, unit: UnitRequest, ahead: bool = False) -> "CompileRequest":
        """`unit` for a compile lane: into the cache, none of its inputs sent."""
        return cls(replace(unit, inputs=[], library=""), ahead=ahead)


@dataclass(frozen=True)
class ChainRequest:
    """Run one-op units one after another in one worker, each fed the earlier ones' target values
    where its inputs reference them (("chain", name, field)), kept on the device in between: the
    propagated run of a range from per-op kernels, which the compile cache shares between layers.

    The result holds the flat outputs of the ops named in `keep`, in that order; a unit that fails
    ends the chain, and the result's message names its op (`failed_op`).

    With a `screen` (`ChainScreen`), the chain is a search instead.
    """

    units: list[UnitRequest]
    names: list[str]  # the op each unit computes, in order
    keep: list[str] = field(default_factory=list)
    sync_each: bool = False  # wait for the device after each unit: a fault is reported by the unit that made it
    screen: ChainScreen | None = None


@dataclass(frozen=True)
class ChainScreen:
    """What makes a chain a search: each op's value is checked against its recorded one
    (judge/screen.py, `rule`) as it is computed; an op not in `accept` whose value does not clearly
    pass (or that is in `unscreened`) is a suspect, and the chain stops at its `suspects`-th one.
    The result's `suspects` name them in order, its outputs are theirs, and `upstream` holds, per
    suspect, the target values of its chain-fed inputs. No suspect: every value clearly passed."""

    rule: ScreenRule
    accept: frozenset[str] = frozenset()  # never suspects (already judged, or judged elsewhere)
    unscreened: frozenset[str] = frozenset()  # always suspects: only the full verdict can judge them
    suspects: int = 1
    also_keep: frozenset[str] = frozenset()  # values returned whatever the screen says (`also_kept`)
    isolated_rule: ScreenRule | None = None  # with `log`: each value checked against this rule too
    log: str = ""  # the file each unit's outcome is appended to as it runs (runtime/chain_log.py)


@dataclass(frozen=True)
class BatchRequest:
    """Isolated runs of one-op units (each fed recorded values only) as one request to one worker,
    each value screened there against its recorded one: only the values it cannot clear come back
    (the result's `suspects` and their `outputs`), and it stops at its `suspects`-th one (an op in
    `unscreened` always is one). `defer_unbuilt`: a unit whose library is not in the cache yet is
    not built nor waited for but skipped, named in the result's `deferred` (compile lanes are
    building it: the batch's other units run meanwhile). Nothing of one unit feeds the next."""

    units: list[UnitRequest]
    names: list[str]  # the op each unit computes, in order
    rule: ScreenRule  # what each value is screened against (judge/screen.py)
    unscreened: frozenset[str] = frozenset()
    suspects: int = 1
    defer_unbuilt: bool = False


@dataclass(frozen=True)
class BuildRequest:
    """Compile units into the cache without running them, several into one library where the target
    allows (`compile_cache.build_together`): what the builder ahead of a search sends, a few dozen
    units at a time. A key another worker is building is left to it. The result's `unit_keys`:
    (key, from the cache) of each unit that has one."""

    units: list[UnitRequest]


# -- results: one type per request kind ----------------------------------------------------------
@dataclass(frozen=True)
class Result:
    """How a request ended, whatever its kind (what the executor and the lanes look at)."""

    status: UnitStatus
    message: str = ""
    seconds: float = 0.0
    poisoned: bool = False  # it ended in a fault that can poison its process (`poisons_worker`): that worker is retired
    fresh_rerun: bool = False  # the first attempt's fault may have been inherited: this is the run in a fresh worker

    @property
    def ok(self) -> bool:
        return self.status == UnitStatus.OK

    def units_built(self) -> list[tuple[str, bool]]:
        """(cache key, from the cache) of each unit this request compiled or found built."""
        return []

    def units_remembered(self) -> int:
        """Units not run: the trace's memo gave them (runtime/run_memo.py)."""
        return 0


@dataclass(frozen=True)
class UnitResult(Result):
    """What a unit run (`UnitRequest`) gave: its flat outputs, and the library it ran."""

    outputs: list[list[np.ndarray]] = field(default_factory=list)
    cached: bool = False  # the library came from the cache (False: compiled for this unit, or not at all)
    key: str = ""  # the compile cache's key of the unit (empty when it did not compile)
    library: str = ""  # the compiled library's path in the cache

    def units_built(self) -> list[tuple[str, bool]]:
        return [(self.key, self.cached)] if self.key else []


@dataclass(frozen=True)
class CompileResult(Result):
    """What a compile (`CompileRequest`) gave: the unit's key and library in the cache."""

    cached: bool = False  # the library was in the cache already (False: compiled for this request, or not at all)
    key: str = ""  # the compile cache's key of the unit (empty when it did not compile, or only its code was made)
    library: str = ""  # the compiled library's path in the cache

    def units_built(self) -> list[tuple[str, bool]]:
        return [(self.key, self.cached)] if self.key else []


@dataclass(frozen=True)
class ChainResult(Result):
    """What a chain (`ChainRequest`) gave: the kept values (a screening chain: its suspects'), and
    the op whose unit failed (`failed_op`), when one did."""

    outputs: list[list[np.ndarray]] = field(default_factory=list)
    failed_op: str = ""
    suspects: list[str] = field(default_factory=list)  # a screening chain's suspects, in order
    upstream: dict[str, dict[str, list[np.ndarray]]] = field(default_factory=dict)  # per suspect: its chain-fed inputs
    also_kept: dict[str, list[np.ndarray]] = field(default_factory=dict)  # a screening chain's `also_keep` values
    unit_keys: list[tuple[str, bool]] = field(default_factory=list)  # its units: (cache key, from the cache)
    read_ahead: int = 0  # recorded values its worker read ahead while it waited for a build
    remembered: int = 0  # units not run: a checkpoint of the trace's memo gave their values

    @property
    def cached(self) -> bool:
        """Every unit that ran came from the cache (a failed chain: False)."""
        return self.ok and all(cached for _key, cached in self.unit_keys)

    def units_built(self) -> list[tuple[str, bool]]:
        return self.unit_keys

    def units_remembered(self) -> int:
        return self.remembered


@dataclass(frozen=True)
class BatchResult(Result):
    """What a batch (`BatchRequest`) gave: its suspects and their values, the units it skipped."""

    outputs: list[list[np.ndarray]] = field(default_factory=list)  # the suspects' values, in their order
    failed_op: str = ""
    suspects: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # units skipped, not built yet (`defer_unbuilt`)
    unit_keys: list[tuple[str, bool]] = field(default_factory=list)  # its units: (cache key, from the cache)
    remembered: int = 0  # units not run: an earlier run cleared them (the trace's memo)

    def units_built(self) -> list[tuple[str, bool]]:
        return self.unit_keys

    def units_remembered(self) -> int:
        return self.remembered

    def after(self, earlier: "BatchResult") -> "BatchResult":
        """This run of a batch's units from its failing one on, after `earlier`'s units before it."""
        return replace(self, suspects=earlier.suspects + self.suspects, outputs=earlier.outputs + self.outputs,
                       unit_keys=earlier.unit_keys + self.unit_keys, deferred=earlier.deferred + self.deferred,
                       remembered=earlier.remembered + self.remembered)


@dataclass(frozen=True)
class BuildResult(Result):
    """What a build (`BuildRequest`) gave: (cache key, from the cache) of each unit that has one."""

    unit_keys: list[tuple[str, bool]] = field(default_factory=list)

    def units_built(self) -> list[tuple[str, bool]]:
        return self.unit_keys


Request = UnitRequest | CompileRequest | ChainRequest | BatchRequest | BuildRequest
AnyResult = UnitResult | CompileResult | ChainResult | BatchResult | BuildResult
_RESULT_OF = {UnitRequest: UnitResult, CompileRequest: CompileResult, ChainRequest: ChainResult,
              BatchRequest: BatchResult, BuildRequest: BuildResult}


def ended(request: Request, status: UnitStatus, message: str = "", seconds: float = 0.0) -> AnyResult:
    """`request`'s result, of its kind, for a run that ended without the worker's reply (a crash, a
    timeout) or before its units ran."""
    return _RESULT_OF[type(request)](status, message=message, seconds=seconds)


@dataclass
class WorkerReply:
    """What a worker sends back for a request: its result, and the worker's resident memory (the
    executor replaces a worker that grew too much: `TargetExecutor._recycle_if_grown`)."""

    result: AnyResult
    rss: int | None = None
