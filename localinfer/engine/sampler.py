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

Step 4 is :mod:`localinfer.engine.sampling_dist`: the same distribution as the definition by a
full sort (:func:`localinfer.engine.sampling_exact.exact_sampling_probs`), cut to a candidate
set first and only that sorted. Penalties touch only the tokens seen: the sampler keeps their
ids and counts, never a vocabulary-sized array of them.

Reported log-probabilities are those of the model's own distribution (log-softmax of the raw
logits, before penalties and temperature), which is what OpenAI's ``logprobs`` means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.engine.constraint import MaskedChoice, SequenceConstraint
from localinfer.engine.sampling_dist import sampling_dist
from localinfer.engine.sampling_exact import exact_sampling_probs
from localinfer.engine.types import SamplingParams

__all__ = [
    "SampledToken",
    "TokenSampler",
    "draw",
    "exact_sampling_probs",
    "sampling_dist",
    "sampling_probs",
]


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
        # Ids seen in prompt + output (repetition) and output counts (presence, frequency),
        # kept only when a penalty uses them: the work per token is the size of these sets.
        self._seen: set[int] = set()
        self._seen_ids: np.ndarray = np.zeros(0, dtype=np.int64)
        self._counts: dict[int, int] = {}
        if self._uses_repetition and len(prompt_ids):
            ids = np.unique(np.asarray(prompt_ids, dtype=np.int64))
            if ids[0] < 0 or ids[-1] >= vocab_size:
                raise IndexError(f"prompt token ids must lie in [0, {vocab_size})")
            self._seen, self._seen_ids = set(ids.tolist()), ids
        self._masked = None if constraint is None else MaskedChoice(constraint, vocab_size)
        self._deferred: MaskedChoice | None = None  # a constraint waiting for the reasoning
        self._forced: list[int] = []  # tokens to emit next whatever the logits say

    def defer_constraint(self) -> None:
        """Hold the constraint back (a thinking request reasons freely first)."""
        self._deferred, self._masked = self._masked, None

    def start_constraint(self) -> None:
        """The reasoning ended: the constraint applies from the next token."""
        if self._deferred is not None:
            self._masked, self._deferred = self._deferred, None

    @property
    def waiting(self) -> bool:
        """A constraint is held back for the reasoning to end."""
        return self._deferred is not None

    def force(self, token_ids: Sequence[int]) -> None:
        """Emit ``token_ids`` next, one per step (a thinking budget's closing tag)."""
        self._forced.extend(token_ids)

    @property
    def forcing(self) -> bool:
        return bool(self._forced)

    @property
    def constraint(self) -> SequenceConstraint | None:
        masked = self._masked or self._deferred
        return None if masked is None else masked.constraint

    @property
    def penalises(self) -> bool:
        """Whether a penalty changes the logits (it needs the tokens seen so far)."""
        return self._uses_repetition or self._uses_counts

    def accept(self, token_id: int) -> SampledToken:
        """A token drawn elsewhere (inside the runner) taken as this request's next: observed,
        and a constraint, if any, advanced."""
        if self._masked is not None:
            self._masked.constraint.advance(token_id)
        self.observe(token_id)
        return SampledToken(token_id=token_id)

    def observe(self, token_id: int) -> None:
        """Record a generated token (called for every emitted token, sampled or not)."""
        if self._uses_repetition and token_id not in self._seen:
            self._seen.add(token_id)
            self._seen_ids = np.append(self._seen_ids, np.int64(token_id))
        if self._uses_counts:
            self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def sample(self, logits: np.ndarray) -> SampledToken:
        """Pick the next token from ``logits`` (``[vocab]`` or ``[1, vocab]``) and observe it."""
        raw = np.asarray(logits, dtype=np.float32).reshape(-1)  # [vocab]
        if raw.shape[0] < self.vocab_size:
            raise ValueError(f"logits have {raw.shape[0]} entries, vocab is {self.vocab_size}")
        raw = raw[: self.vocab_size]
        # A finite maximum is a finite logit: the full check only when the maximum is not.
        if not np.isfinite(np.max(raw)) and not np.isfinite(raw).any():
            raise ValueError("model produced no finite logits")
        if self._forced:
            token = self._forced.pop(0)
            chosen_lp, top = self.logprobs(raw, token)
            self.observe(token)
            return SampledToken(token_id=token, logprob=chosen_lp, top=top)
        x = self.penalised(raw)
        if self._masked is not None:
            x = self._masked.mask(x)
        if self.params.greedy:
            token = int(np.argmax(x))
        else:
            token = sampling_dist(self.params, x).draw(self.rng)
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
        if self._uses_repetition and self._seen_ids.shape[0]:
            idx = self._seen_ids
            vals = x[idx]
            x[idx] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if self._uses_counts and self._counts:
            idx = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.int32, count=len(self._counts))
            x[idx] -= p.presence_penalty + p.frequency_penalty * counts
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
    exactly this distribution, so it is defined once: it is :func:`sampling_dist`'s (no sort of
    the vocabulary), equal to :func:`exact_sampling_probs`, the definition by a full sort."""
    return sampling_dist(params, x).dense()


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a dense [vocab] distribution (inverse CDF over ascending ids, never a
    zero-probability id). The running sum skips the zeros (adding 0.0 changes no partial sum,
    so the token is the one the sum over every id gives), so a truncated distribution costs a
    scan for its nonzeros, not a float64 cumulative sum of the vocabulary."""
    ids = np.flatnonzero(probs)
    cum = np.cumsum(probs[ids])
    pos = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(ids[min(pos, ids.shape[0] - 1)])  # past the end: the float edge of the sum
