"""Per-request token sampling in numpy on float32 logits.

Each request owns a :class:`TokenSampler` with its own ``numpy.random.Generator`` seeded from
``SamplingParams.seed``, so a seeded request draws the same tokens whatever else shares its batch.

Order of operations (the same as vLLM / Hugging Face):

1. penalties on the raw logits: repetition (over prompt + output, divides positive logits and
   multiplies negative ones), presence and frequency (over the output only, OpenAI semantics);
2. a constrained request's mask: tokens its constraint forbids get -inf (the chosen token then
   advances the constraint);
3. greedy (temperature 0): argmax, first index on ties;
4. otherwise temperature, then top-k, then softmax, min-p, top-p, and one uniform draw.

Reported log-probabilities are those of the model's own distribution (log-softmax of the raw
logits, before penalties and temperature), which is what OpenAI's ``logprobs`` means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.engine.constraint import MaskedChoice, SequenceConstraint
from localinfer.engine.types import SamplingParams


@dataclass(slots=True, frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None = None  # of the chosen token; None unless logprobs were asked for
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob) best alternatives, best first


class TokenSampler:
    """Sampling state of one request: its generator, the token counts penalties need, and its
    constraint (None: unconstrained, and no mask work at all)."""

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        prompt_ids: Sequence[int],
        constraint: SequenceConstraint | None = None,
    ) -> None:
        self.params = params
        self.vocab_size = vocab_size
        # A fresh OS-seeded generator when no seed is given; never a shared global one.
        self.rng = np.random.default_rng(params.seed)
        self._uses_repetition = params.repetition_penalty != 1.0
        self._uses_counts = params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
        self._seen = np.zeros(vocab_size, dtype=bool)  # prompt + output, for repetition
        self._counts = np.zeros(vocab_size, dtype=np.int32)  # output only
        if self._uses_repetition and len(prompt_ids):
            self._seen[np.asarray(prompt_ids, dtype=np.int64)] = True
        self._masked = None if constraint is None else MaskedChoice(constraint, vocab_size)

    @property
    def constraint(self) -> SequenceConstraint | None:
        return None if self._masked is None else self._masked.constraint

    def observe(self, token_id: int) -> None:
        """Record a generated token (called for every emitted token, sampled or not)."""
        self._seen[token_id] = True
        self._counts[token_id] += 1

    def sample(self, logits: np.ndarray) -> SampledToken:
        """Pick the next token from ``logits`` (``[vocab]`` or ``[1, vocab]``) and observe it."""
        raw = np.asarray(logits, dtype=np.float32).reshape(-1)  # [vocab]
        if raw.shape[0] < self.vocab_size:
            raise ValueError(f"logits have {raw.shape[0]} entries, vocab is {self.vocab_size}")
        raw = raw[: self.vocab_size]
        if not np.isfinite(raw).any():
            raise ValueError("model produced no finite logits")
        x = self.penalised(raw)
        if self._masked is not None:
            x = self._masked.mask(x)
        if self.params.greedy:
            token = int(np.argmax(x))
        else:
            token = draw(sampling_probs(self.params, x), self.rng)
        if self._masked is not None:
            self._masked.constraint.advance(token)
        chosen_lp, top = self.logprobs(raw, token)
        self.observe(token)
        return SampledToken(token_id=token, logprob=chosen_lp, top=top)

    def penalised(self, raw: np.ndarray) -> np.ndarray:
        """``raw`` [vocab] logits with this request's penalties applied (its counts so far)."""
        p = self.params
        if not (self._uses_repetition or self._uses_counts):
            return raw
        x = raw.copy()
        if self._uses_repetition:
            idx = np.flatnonzero(self._seen)
            vals = x[idx]
            x[idx] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if self._uses_counts:
            idx = np.flatnonzero(self._counts)
            x[idx] -= p.presence_penalty + p.frequency_penalty * self._counts[idx]
        return x

    def logprobs(
        self, raw: np.ndarray, token: int
    ) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        """Log-probability of ``token`` and the top-N alternatives under the model's own
        distribution (raw logits), or (None, ()) when the request asked for none."""
        n = self.params.logprobs
        if n is None:
            return None, ()
        shifted = raw.astype(np.float64) - np.max(raw)
        logz = np.log(np.exp(shifted).sum())
        lp = shifted - logz  # [vocab]
        top: tuple[tuple[int, float], ...] = ()
        if n > 0:
            n = min(n, lp.shape[0])
            idx = np.argpartition(-lp, n - 1)[:n]
            idx = idx[np.argsort(-lp[idx], kind="stable")]
            top = tuple((int(i), float(lp[i])) for i in idx)
        return float(lp[token]), top


def sampling_probs(params: SamplingParams, x: np.ndarray) -> np.ndarray:
    """[vocab] float64 summing to 1: temperature, top-k, softmax, min-p, top-p on (penalised)
    logits ``x``; a point mass on the argmax when greedy. Speculative verification compares
    exactly this distribution, so it is defined once, here."""
    if params.greedy:
        return _point_mass(x)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = x / np.float32(params.temperature)
    if not np.isfinite(np.max(scaled)):
        # A temperature so small that the scaled logits overflow float32 (1e-40 and below; one
        # that rounds to 0.0 divides by zero): its limit, the argmax. Left alone, inf - inf made
        # every probability NaN and the draw fell on the last token of the vocabulary.
        return _point_mass(x)
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


def _point_mass(x: np.ndarray) -> np.ndarray:
    probs = np.zeros(x.shape[0], dtype=np.float64)
    probs[int(np.argmax(x))] = 1.0
    return probs


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a distribution (inverse CDF, never a zero-probability id)."""
    cum = np.cumsum(probs)
    token = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    if token >= probs.shape[0] or probs[token] == 0.0:
        token = int(np.flatnonzero(probs)[-1])  # the float edge at the very end of the sum
    return token
