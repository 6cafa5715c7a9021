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

from localinfer.engine.sampler import TokenSampler, draw, sampling_probs
from localinfer.engine.types import SamplingParams

__all__ = ["draw", "proposal_probs", "target_probs"]


def target_probs(sampler: TokenSampler, logits: np.ndarray) -> np.ndarray:
    """[vocab] float64, sums to 1: what ``sampler.sample(logits)`` would draw from now."""
    raw = _checked(logits, sampler.vocab_size)
    # The sampler's own penalty step, with its counts of the tokens observed so far.
    return sampling_probs(sampler.params, sampler.penalised(raw))


def proposal_probs(params: SamplingParams, logits: np.ndarray, vocab_size: int) -> np.ndarray:
    """[vocab] float64, sums to 1: the draft's sampling distribution for a request."""
    return sampling_probs(params, _checked(logits, vocab_size))


def _checked(logits: np.ndarray, vocab_size: int) -> np.ndarray:
    raw = np.asarray(logits, dtype=np.float32).reshape(-1)  # [vocab]
    if raw.shape[0] < vocab_size:
        raise ValueError(f"logits have {raw.shape[0]} entries, vocab is {vocab_size}")
    return raw[:vocab_size]
