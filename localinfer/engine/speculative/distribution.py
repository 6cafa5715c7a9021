"""The probability distributions that rejection sampling compares.

``target_probs`` is exactly the distribution :class:`TokenSampler` draws from for a request:
penalties (with the sampler's running counts), temperature, top-k, softmax, min-p, top-p - the
same steps in the same order, so speculation samples the request's own distribution.
``proposal_probs`` is what a draft model samples its proposals from: the request's temperature
and truncations applied to the draft's logits (no penalties: the draft keeps no counts, and
any q is valid as long as verification uses the same q).
"""

from __future__ import annotations

import numpy as np

from localinfer.engine.sampler import TokenSampler
from localinfer.engine.types import SamplingParams


def target_probs(sampler: TokenSampler, logits: np.ndarray) -> np.ndarray:
    """[vocab] float64, sums to 1: what ``sampler.sample(logits)`` would draw from now."""
    raw = _checked(logits, sampler.vocab_size)
    # The sampler's own penalty step, with its counts of the tokens observed so far.
    x = sampler._penalised(raw)  # noqa: SLF001 - one definition of the penalties
    return transformed_probs(sampler.params, x)


def proposal_probs(params: SamplingParams, logits: np.ndarray, vocab_size: int) -> np.ndarray:
    """[vocab] float64, sums to 1: the draft's sampling distribution for a request."""
    return transformed_probs(params, _checked(logits, vocab_size))


def transformed_probs(params: SamplingParams, x: np.ndarray) -> np.ndarray:
    """Temperature, top-k, softmax, min-p, top-p on (penalised) logits ``x`` [vocab]."""
    if params.greedy:
        probs = np.zeros(x.shape[0], dtype=np.float64)
        probs[int(np.argmax(x))] = 1.0
        return probs
    x = x / np.float32(params.temperature)
    if 0 < params.top_k < x.shape[0]:
        kth = np.partition(x, -params.top_k)[-params.top_k]
        x = np.where(x >= kth, x, -np.inf)
    x = x - np.max(x)
    probs = np.exp(x, dtype=np.float64)
    probs /= probs.sum()
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        keep = int(np.searchsorted(cum, params.top_p * cum[-1])) + 1
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[:keep]] = True
        probs = np.where(mask, probs, 0.0)
    return probs / probs.sum()


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a normalised distribution (inverse CDF, never a zero-probability id)."""
    cum = np.cumsum(probs)
    token = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    if token >= probs.shape[0] or probs[token] == 0.0:
        token = int(np.flatnonzero(probs)[-1])  # the float edge at the very end of the sum
    return token


def _checked(logits: np.ndarray, vocab_size: int) -> np.ndarray:
    raw = np.asarray(logits, dtype=np.float32).reshape(-1)  # [vocab]
    if raw.shape[0] < vocab_size:
        raise ValueError(f"logits have {raw.shape[0]} entries, vocab is {vocab_size}")
    return raw[:vocab_size]
