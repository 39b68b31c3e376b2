"""What the engine and a target worker say to each other: a request, a result, its status."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from tapml_dbg.runtime.target import TargetSpec


class UnitStatus(StrEnum):
    """How a unit's compile and run ended (`target-lost`: the RPC connection dropped, no verdict)."""

    OK = "ok"
    COMPILE_ERROR = "compile-error"
    ERROR = "error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    TARGET_LOST = "target-lost"


@dataclass
class WorkerConfig:
    """What a worker serves: one trace on one target, compiling through one cache."""

    trace_path: str
    spec: TargetSpec
    cache_dir: str = ""

    def to_json(self) -> str:
        return json.dumps({"trace_path": self.trace_path, "spec": self.spec.to_json(), "cache_dir": self.cache_dir})

    @classmethod
    def from_json(cls, text: str) -> "WorkerConfig":
        data = json.loads(text)
        return cls(data["trace_path"], TargetSpec.from_json(data["spec"]), data["cache_dir"])


@dataclass
class UnitRequest:
    """Run one unit. Inputs are ("input"|"param", name), ("op", name, field) or ("value", array)."""

    unit_json: dict
    inputs: list[tuple]
    outputs: list[str] = field(default_factory=list)
    compile_only: bool = False



@dataclass
class UnitResult:
    """What a unit run gave."""

    status: UnitStatus
    outputs: list[list[np.ndarray]] = field(default_factory=list)
    message: str = ""
    cached: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == UnitStatus.OK
