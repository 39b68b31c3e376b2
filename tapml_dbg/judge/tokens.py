"""The token rule of a generation: per step, the source's and the target's greedy choice, and whether a
differing choice is drift or a bug.

vLLM's `check_logprobs_close` rule: where the two sides' top-1 tokens differ, the step passes as drift
when each side's token is in the other side's top-k (a near tie that rounding can flip), and is a bug
otherwise. Beside it, llama.cpp's per-token KL divergence of the two distributions, KL(source || target)
over the softmax of the logits in float64, which measures how far apart they are even where the top-1
agrees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOKEN_TOP_K = 5  # the k of the top-k rule (vLLM's tests use 5 logprobs)
SAME, DRIFT, BUG = "same", "drift", "bug"  # a step's token verdict


@dataclass
class TokenStep:
    """One step's tokens: the source's greedy choice against the target's, on teacher-forced logits."""

    step: int
    position: int  # the sequence position of the token this step chooses
    source: int
    target: int
    in_top_k: bool  # each side's token is in the other side's top-k (trivially true when they agree)
    kl: float  # KL(source || target) of the softmax of the logits, in nats (inf: NaN or Inf logits)
    error: float  # max |target - source| / max |source| of the step's logits

    @property
    def verdict(self) -> str:
        return SAME if self.source == self.target else (DRIFT if self.in_top_k else BUG)

    def to_json(self) -> dict:
        return {"step": self.step, "position": self.position, "source": self.source, "target": self.target,
                "in_top_k": self.in_top_k, "kl": self.kl, "error": self.error, "verdict": self.verdict}

    def first_bad_json(self) -> dict:
        """The CLI contract's `first_bad_token` object."""
        return {"step": self.step, "position": self.position, "source": self.source, "target": self.target,
                "in_top_k": self.in_top_k}


def compare_step(step: int, position: int, source: np.ndarray, target: np.ndarray, k: int = TOKEN_TOP_K) -> TokenStep:
    """The token verdict of one step from its last position's logits (1-D over the vocabulary)."""
    source = np.asarray(source, dtype=np.float64).reshape(-1)
    target = np.asarray(target, dtype=np.float64).reshape(-1)
    finite = bool(np.isfinite(source).all() and np.isfinite(target).all())
    ours, theirs = int(np.argmax(source)), int(np.nanargmax(target)) if np.isfinite(target).any() else -1
    in_top_k = ours == theirs or (finite and ours in _top_k(target, k) and theirs in _top_k(source, k))
    scale = float(np.max(np.abs(source))) if source.size else 0.0
    with np.errstate(all="ignore"):
        error = float(np.max(np.abs(target - source)) / scale) if finite and scale > 0 else (
            0.0 if finite else float("inf"))
    return TokenStep(step, position, ours, theirs, bool(in_top_k), _kl(source, target) if finite else float("inf"),
                     error)


def _top_k(logits: np.ndarray, k: int) -> set[int]:
    k = min(k, logits.size)
    return {int(i) for i in np.argpartition(-logits, k - 1)[:k]}


def _kl(source: np.ndarray, target: np.ndarray) -> float:
    log_p, log_q = _log_softmax(source), _log_softmax(target)
    return max(0.0, float(np.sum(np.exp(log_p) * (log_p - log_q))))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - np.max(logits)
    return shifted - np.log(np.sum(np.exp(shifted)))
