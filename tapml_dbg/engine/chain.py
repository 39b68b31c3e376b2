"""The per-op search: the first op whose value is wrong, from one chained run of per-op kernels.

Every op of the searched range is compiled alone (the compile cache compiles each distinct op
once: GPT-2 124M's 717 ops are 68 units) and the kernels run one after another on the target,
each fed the target values of the ops before it. The worker checks each value against its
recorded one as it is computed (judge/screen.py, a sound shortcut: a value it passes is one the
full verdict passes) and stops at the first values it cannot clear, the suspects. Each suspect is
judged in full, in order: its isolated verdict first (its kernel on recorded inputs; a wrong
kernel ends the search at once), then its propagated verdict (the value the chain computed). The
first suspect that fails is the answer; suspects that pass are accepted and the chain runs again.

Kept ops (engine/kept.py) are left out of the chain: the ops after one are fed its recorded
value, so the search goes on past a known bug (the worker's chain needs nothing new for that).
Ops whose import changed their type are not judged here (the type phase of `engine.search`
finds them from the trace alone); their consumers are. A chain that does not come back (a kernel that
kills the worker, a timeout) says so (`lost`), and the caller searches another way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from tapml_dbg.engine.fused import UnitParts
from tapml_dbg.judge.verdict import PROPAGATED, Verdict
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.runtime.messages import ChainScreen

CHAIN_SUSPECTS = 8  # suspects a chain collects before it stops: a passing one costs no second run


@dataclass(frozen=True)
class ChainFinding:
    """What a chained run found (phase 1): the first wrong op with its verdict, or nothing."""

    index: int | None = None
    verdict: Verdict | None = None  # isolated when the op is wrong alone, else propagated (or a failed run)
    upstream: dict = field(default_factory=dict, compare=False)  # the chain's target values of the op's inputs
    lost: bool = False  # the chain died without saying where (crash, timeout): nothing is known
    message: str = ""
    runs: int = 0  # chained runs made
    probes: tuple[tuple[int, bool], ...] = ()  # (k, ops first..k wrong?), as a search trace
    kept: dict = field(default_factory=dict, compare=False)  # the `also_keep` values of a run to the end


class ChainSearchParts(UnitParts, Protocol):
    """What the per-op search uses of a session (an `engine.session.Session` is one), besides a unit's
    parts: the ops by name, an op's isolated verdict (a suspect's, first), the torch import started while
    the chain runs."""

    by_name: dict[str, OpInfo]

    def isolated(self, index: int) -> Verdict: ...

    def warm_up_torch(self) -> None: ...


class ChainSearch:
    """One per-op search over ops [first, last] of a session."""

    def __init__(self, session: ChainSearchParts, first: int, last: int, unscreened: set[str],
                 also_keep: set[str] = frozenset(), log: tuple | None = None):
        """`unscreened`: the ops only a full verdict may judge (`Verdicts.unscreened`); `also_keep`: ops whose
        values a run to the end hands back too (`ChainFinding.kept`); `log`: (a `Runtime.chain_log`, the
        isolated screen rule): each run's outcomes written there as it goes, each value checked
        against that rule too (a sweep beside follows it: `isolated.ChainLead`)."""
        self.session = session
        self.also_keep = also_keep
        self.first, self.last = first, last
        # a kept op is no unit of the chain: its consumers read its recorded value (engine/kept.py)
        self.indices = [i for i in range(first, last + 1) if session.ops[i].outputs and i not in session.kept]
        typed = session.verdicts.type_changed_names()
        self.accept, self.unscreened = set(typed), unscreened - typed
        self.screen = session.verdicts.screen_rule(PROPAGATED)
        self.log = log
        self.timeout = session.lanes.chain_timeout(len(self.indices))

    def request(self, runs: int = 0):
        """The next chained run: every op, the ones judged so far accepted; each run collects twice
        the suspects of the one before, so a model of many passing suspects costs O(log N) runs."""
        logged = {"log": self.log[0].path, "isolated_rule": self.log[1]} if self.log is not None else {}
        screen = ChainScreen(self.screen, accept=frozenset(self.accept), unscreened=frozenset(self.unscreened),
                             suspects=self._suspects(runs), also_keep=frozenset(self.also_keep), **logged)
        return replace(self.session.requests.chain(self.indices, keep=[]), screen=screen)

    @staticmethod
    def _suspects(runs: int) -> int:
        return CHAIN_SUSPECTS * 2 ** min(runs, 16)

    def bound(self, result) -> int | None:
        """The highest op a sweep beside this chain's run still needs (None: every op)."""
        names = result.suspects or ([result.failed_op] if not result.ok and result.failed_op else [])
        return self.session.by_name[names[0]].index if names else None

    def run(self, first=None) -> ChainFinding:
        """The search; `first`: the first chained run (request, result), when it ran beside a sweep."""
        session = self.session
        if not self.indices:
            return ChainFinding()
        if first is None:
            self.prepare()
        runs = 0
        while True:
            request = self.request(runs) if first is None else first[0]
            session.warm_up_torch()  # the full verdicts' torch, while the chain runs
            result = first[1] if first is not None else session.lanes.run(request, self.timeout)
            first = None
            self.remember(request, result)
            wanted = self._suspects(runs)
            runs += 1
            for name, values in zip(result.suspects, result.outputs):
                index = session.by_name[name].index
                verdict = self._wrong(index, result, values)
                if verdict is not None:
                    return self._found(runs, index, verdict, result.upstream.get(name, {}))
                self.accept.add(name)
            if not result.ok:
                if not result.failed_op:  # the worker died mid-chain: which op killed it is unknown
                    return ChainFinding(lost=True, message=result.message, runs=runs)
                index = session.by_name[result.failed_op].index
                isolated = session.isolated(index)
                verdict = isolated if isolated.failed else session.verdicts.judge(index, PROPAGATED, result, None)
                return self._found(runs, index, verdict, {})
            if len(result.suspects) < wanted:  # it ran to the end
                return ChainFinding(runs=runs, probes=((self.last, False),), kept=result.also_kept)

    def _wrong(self, index: int, result, values: list) -> Verdict | None:
        """The failing verdict of a suspect (None: it passes both ways)."""
        session = self.session
        isolated = session.isolated(index)
        if isolated.failed:
            return isolated
        fed = {session.ops[i].name for i in self.indices if i < index}
        verdict = session.verdicts.judge(index, PROPAGATED, result, values, fed_by_target=fed)
        return verdict if verdict.failed else None

    def _found(self, runs: int, index: int, verdict: Verdict, upstream: dict) -> ChainFinding:
        probes = ((index - 1, False),) if index > self.first else ()
        return ChainFinding(index, verdict, upstream, runs=runs, probes=probes + ((index, True),))

    def prepare(self) -> None:
        """Every distinct unit of the chain the cache does not hold yet, built ahead by the runtime
        (`Runtime.compile_ahead`) before a chain that runs alone. (Beside a sweep, the runtime's
        overlap policy compiles them in the background while the chain runs: the chain then takes each
        unit it reaches from the cache, waiting on the unit's lock while a compile lane builds it, or
        builds it itself.)"""
        if self.indices and self.session.lanes.compiles_ahead:
            self.session.lanes.compile_ahead(self.units_to_build())

    def units_to_build(self) -> list:
        """Every distinct unit of the chain the cache does not hold yet (as far as its index knows), in
        the chain's order."""
        return self.session.lanes.units_to_build(self.session.requests.to_build(index) for index in self.indices)

    def remember(self, request, result) -> None:
        """Tell the runtime the key of every unit the chain ran (for the next prepare)."""
        self.session.lanes.remember(request, result)
