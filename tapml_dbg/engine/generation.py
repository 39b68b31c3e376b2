"""A generation trace's tokens on the target: the first bad token, per-step KL, free running.

A generation trace (`record --generate N`, frontend/generation.py) is one graph of a prefill and N
decode steps whose input `tokens` holds the source's greedy tokens. Its output is every step's
last-position logits.

- Teacher-forced (`tokens`): every op chained on the target from per-op kernels (the bisect's own
  chain, the same compiled units), so the cache and the activations are the target's own and every
  step is fed the source's token; each step's logits against the recording give its token verdict
  (judge/tokens.py: same, drift, bug) and its KL. The first bad token is the first step whose
  target top-1 differs from the source's; `in_top_k` says whether that is drift.
- Free-running (`free_running`): what a user of the target sees, the target fed its own tokens. The
  chain is run again with `tokens` replaced: each run fixes the first step whose fed token is not the
  target's own choice, so it takes one run more than the number of steps where the target's choice
  departs from what it was fed (at most N + 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from tapml_dbg.engine.propagation import ChainParts, run_on_target
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.tokens import BUG, TOKEN_TOP_K, TokenStep, compare_step
from tapml_dbg.model.generation import TOKENS_INPUT, GenerationInfo
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.schema import META_GENERATION

TEACHER_FORCED, FREE_RUNNING = "teacher-forced", "free-running"
NOT_GENERATION = ("{trace} is not a generation trace: record a transformers causal LM with --generate N "
                  "(docs/generation.md) to see its tokens")


class GenerationParts(ChainParts, Protocol):
    """What the tokens use of a session (an `engine.session.Session` is one): the trace, its ops by name,
    the kept ones, the recorded values, where the target is, and a chain's parts (ops, requests, lanes)."""

    reader: TraceReader
    by_name: dict[str, OpInfo]
    kept: set[int]
    where: str
    source_values: Callable[[int], list[np.ndarray]]


@dataclass
class TokenReport:
    """The tokens of every step on the target beside the source's."""

    mode: str  # TEACHER_FORCED or FREE_RUNNING
    target: str
    steps: list[TokenStep] = field(default_factory=list)
    failure: str = ""  # the chain did not run to the end (its one-line reason): no tokens past it
    runs: int = 0  # chained runs made
    top_k: int = TOKEN_TOP_K

    @property
    def first_bad(self) -> TokenStep | None:
        """The first step whose target top-1 differs from the source's (drift or bug)."""
        return next((step for step in self.steps if step.source != step.target), None)

    @property
    def first_bug(self) -> TokenStep | None:
        """The first step whose target token is outside the source's top-k (or the other way round)."""
        return next((step for step in self.steps if step.verdict == BUG), None)

    def to_json(self) -> dict:
        first = self.first_bad
        return {"mode": self.mode, "target": self.target, "top_k": self.top_k, "runs": self.runs,
                "failure": self.failure or None,
                "first_bad_token": first.first_bad_json() if first is not None else None,
                "steps": [step.to_json() for step in self.steps]}


def trace_generation(session: GenerationParts) -> GenerationInfo | None:
    """The trace's generation (None: one forward)."""
    return GenerationInfo.from_meta(session.reader.meta.get(META_GENERATION))


def require_generation(session: GenerationParts) -> GenerationInfo:
    info = trace_generation(session)
    if info is None:
        raise UsageError(NOT_GENERATION.format(trace=session.reader.path))
    return info


def output_name(session: GenerationParts) -> str:
    """The op whose first value is every step's logits (the graph's output)."""
    return session.ops[_output_index(session)].name


@dataclass(frozen=True)
class TokensPhase:
    """The last phase of a bisect on a generation trace: every step's token verdict. A search whose
    chain starts at op 0 has it hand back the output's values (`keep`), so no chain runs again."""

    keep: frozenset[str] = frozenset()  # the op whose first value is every step's logits, when the chain keeps it

    def report(self, session: GenerationParts, chain_kept: dict) -> TokenReport:
        """The tokens, from the chain's kept values where it kept the output, else from a chain of their own."""
        return teacher_forced(session, next((chain_kept.get(name) for name in self.keep), None))


def tokens_phase(session: GenerationParts, first: int) -> TokensPhase | None:
    """The tokens phase of a search starting at op `first` (None: the trace is one forward)."""
    if trace_generation(session) is None:
        return None
    return TokensPhase(frozenset({output_name(session)}) if first == 0 else frozenset())


def teacher_forced(session: GenerationParts, chained: list | None = None) -> TokenReport:
    """Every step's token verdict with the target's own cache, fed the source's tokens. `chained`: the
    output's values from a chain of every op up to it that ran already (a search's), so none runs again."""
    info = require_generation(session)
    report = TokenReport(TEACHER_FORCED, session.where)
    if chained:
        report.runs = 1
        logits = np.asarray(chained[0])
    else:
        logits = _target_logits(session, None, report)
    if logits is not None:
        report.steps = _compare(info, _source_logits(session), logits)
    return report


def free_running(session: GenerationParts) -> TokenReport:
    """The target fed its own tokens (what a user sees); each step compared with the source's choice
    on the source's own (teacher-forced) logits, so a step past the first departure is the target's
    answer to another prompt: its KL and error say how far apart the two generations are, not a verdict."""
    info = require_generation(session)
    report = TokenReport(FREE_RUNNING, session.where)
    tokens = np.array(session.reader.tensors.input(TOKENS_INPUT), copy=True)
    while True:
        logits = _target_logits(session, tokens, report)
        if logits is None:
            return report
        chosen = [int(np.nanargmax(row)) if np.isfinite(row).any() else -1 for row in _rows(logits)]
        fed = [int(t) for t in tokens.reshape(-1)]
        departs = next((k for k in range(len(fed)) if fed[k] != chosen[k]), None)
        if departs is None:
            report.steps = _compare(info, _source_logits(session), logits)
            return report
        tokens.reshape(-1)[departs] = chosen[departs]


def _compare(info: GenerationInfo, source: np.ndarray, target: np.ndarray) -> list[TokenStep]:
    return [compare_step(step.step, step.end, s, t) for step, s, t in zip(info.steps, _rows(source), _rows(target))]


def _rows(logits: np.ndarray) -> list[np.ndarray]:
    """(1, steps, vocab) -> one row of logits per step."""
    array = np.asarray(logits)
    return list(array.reshape(-1, array.shape[-1]))


def _output_index(session: GenerationParts) -> int:
    name = session.reader.meta.get("outputs", [None])[0]
    op = session.by_name.get(name)
    if op is None:
        raise UsageError(f"{session.reader.path}'s generation output {name!r} is not an op of the trace")
    return op.index


def _source_logits(session: GenerationParts) -> np.ndarray:
    return session.source_values(_output_index(session))[0]


def _target_logits(session: GenerationParts, tokens: np.ndarray | None, report: TokenReport) -> np.ndarray | None:
    """The output chained from per-op kernels on the target (`tokens`: fed instead of the recorded
    ones); None, with `report.failure` set, when a unit fails."""
    output = _output_index(session)
    indices = [i for i in range(output + 1) if i not in session.kept]
    run = run_on_target(session, indices, keep=[output], fed={TOKENS_INPUT: [tokens]} if tokens is not None else None)
    result = run.result
    report.runs += 1
    if not result.ok or not result.outputs:
        message = result.message or "no output"
        named = result.failed_op and result.failed_op in message
        report.failure = message if named or not result.failed_op else f"op {result.failed_op}: {message}"
        return None
    return np.asarray(run.values[session.ops[output].name][0])
