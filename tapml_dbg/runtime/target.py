"""Where units run: the target string, how it is reached, the user's transform, the limits.

`TargetSpec` is built once from the command line (`from_args`) and travels unchanged to the
engine, the worker lanes and the repro writers; `.where` is the one label reports use.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import asdict, dataclass, replace

from tapml_dbg import portable
from tapml_dbg.errors import TargetError, UsageError
from tapml_dbg.portable import DEFAULT_TARGET, target_label  # one default, one wording: shared with repros

DEFAULT_UNIT_TIMEOUT_S = 300.0  # one compile + run; big fused ranges compile for a while
# how a "no such device here" error ends in tapml-dbg (a repro's says --target / --rpc)
NO_DEVICE_HINT = "use --rpc HOST:PORT for a remote one, or `tapml-dbg compile` to check code generation only"


@dataclass(frozen=True)
class TargetSpec:
    target: str = DEFAULT_TARGET
    rpc: str | None = None  # HOST:PORT of one TVM RPC server
    tracker: str | None = None  # HOST:PORT of a TVM RPC tracker ...
    key: str | None = None  # ... and the device key its servers registered
    transform: str | None = None  # FILE.py:FUNC applied to every module compiled for the target
    timeout_s: float = DEFAULT_UNIT_TIMEOUT_S  # one unit's compile + run
    parallel: int | None = None  # worker lanes; None: one per free tracker server, else 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "TargetSpec":
        """The spec of a subcommand's target options (see `ui.cli.add_target_options`)."""
        return cls(target=args.target, rpc=args.rpc, tracker=args.tracker, key=args.key,
                   transform=args.transform, timeout_s=args.timeout or DEFAULT_UNIT_TIMEOUT_S,
                   parallel=args.parallel)

    @classmethod
    def reference_from_args(cls, args: argparse.Namespace) -> "TargetSpec | None":
        """The trusted reference target of a subcommand's `--reference-*` options; None: none given (the
        target is judged against the recorded source)."""
        target = getattr(args, "reference_target", None)
        if target is None:
            if getattr(args, "reference_rpc", None) or getattr(args, "reference_transform", None):
                raise UsageError("--reference-rpc and --reference-transform go with --reference-target T")
            return None
        return cls(target=target, rpc=args.reference_rpc, transform=args.reference_transform,
                   timeout_s=args.timeout or DEFAULT_UNIT_TIMEOUT_S, parallel=args.parallel)

    @property
    def where(self) -> str:
        return target_label(self.target, self.rpc, self.tracker, self.key)

    @property
    def remote(self) -> bool:
        return bool(self.rpc or self.tracker)

    def with_options(self, **changes) -> "TargetSpec":
        return replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "TargetSpec":
        return cls(**json.loads(text))


@functools.lru_cache(maxsize=16)
def parse_target(text: str):
    """portable's parse_target (a bare kind, a TVM target string or a JSON dict), failing as a TargetError.
    Once per text and process (a target is immutable; compiling asks for it per unit, and a bare
    `cuda` asks the device for its architecture, each time; figures: docs/perf.md)."""
    try:
        return portable.parse_target(text)
    except portable.PortableError as exc:
        raise TargetError(str(exc)) from exc
