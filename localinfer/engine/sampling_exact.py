"""The sampling distribution by its definition: every step over the whole vocabulary, top-p by a
full sort. It is the reference that :mod:`localinfer.engine.sampling_dist` (what the sampler and
speculative verification use) must equal; tests and ``scripts/bench-sampler`` compare the two.
"""

from __future__ import annotations

import numpy as np

from localinfer.engine.types import SamplingParams


def exact_sampling_probs(params: SamplingParams, x: np.ndarray) -> np.ndarray:
    """[vocab] float64 summing to 1: temperature, top-k, softmax, min-p, top-p on (penalised)
    logits ``x``; a point mass on the argmax when greedy.

    Ties: top-k keeps every token equal to the k-th largest scaled logit (so possibly more than
    k); top-p walks the tokens by probability, highest first and the lower id first among equal
    ones, and keeps the shortest head whose mass reaches ``top_p`` of the total."""
    if params.greedy:
        return point_mass(x)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = x / np.float32(params.temperature)
    if not np.isfinite(np.max(scaled)):
        # A temperature so small that the scaled logits overflow float32 (1e-40 and below; one
        # that rounds to 0.0 divides by zero): its limit, the argmax.
        return point_mass(x)
    x = scaled
    if 0 < params.top_k < x.shape[0]:
        kth = np.partition(x, -params.top_k)[-params.top_k]
        x = np.where(x >= kth, x, -np.inf)
    x = x - np.max(x)
    probs = np.exp(x, dtype=np.float64)  # float64: cumulative sums over 50k+ entries
    probs /= probs.sum()
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        # Keep the smallest head whose mass reaches top_p (always at least one token).
        keep = int(np.searchsorted(cum, params.top_p * cum[-1])) + 1
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[:keep]] = True
        probs = np.where(mask, probs, 0.0)
    return probs / probs.sum()


def point_mass(x: np.ndarray) -> np.ndarray:
    """[vocab] float64: all the probability on the argmax of ``x`` (first index on ties)."""
    probs = np.zeros(x.shape[0], dtype=np.float64)
    probs[int(np.argmax(x))] = 1.0
    return probs
