"""The sampling distribution of a request, built without walking the vocabulary in float64 or
sorting it.

It is the distribution :func:`localinfer.engine.sampling_exact.exact_sampling_probs` defines
(temperature, top-k, softmax, min-p, top-p, in that order), computed the way llama.cpp's sampler
chain does: cut to a candidate set first and sort only that.

- top-k: the candidates are the tokens within a few scaled-logit units of the maximum (the
  distance doubles until at least k are in), and the k-th largest is found among them; every
  token equal to it stays, as in the definition.
- min-p: the candidates are the tokens whose probability can reach ``min_p`` of the maximum
  (a threshold on the shifted logit, with a margin); the definition's test then runs on them.
- top-p alone: the total mass needs every token, so one float32 ``exp`` pass sums it (in blocks,
  accumulated in float64); the candidates are the tokens within a few units of the maximum,
  widened until they hold ``top_p`` of that total. Only the candidates get float64 weights.
- top-p's cut (:func:`_head`): the candidates' weights summed into narrow buckets by value
  (one ``bincount``), the bucket where the running mass reaches the cut found, and only that
  bucket sorted. Ties are the definition's: tokens by probability, highest first, the lower id
  first among equal ones (equal weights share a bucket, and its sort is stable by id).
- temperature alone keeps every token: :class:`Softmax` draws by float32 block sums (float64
  running total) and float64 weights inside the one block the draw lands in.

Every draw takes exactly one ``rng.random()``, and inverse-CDF over ascending ids like the
dense definition, so a seeded request draws the same tokens as the full-sort definition would
(short of a uniform landing within float rounding of a boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from localinfer.engine.types import SamplingParams

BLOCK = 512  # tokens per float32 partial sum of the whole vocabulary
# Scaled-logit distances below the maximum tried in turn for the candidates: a language
# model's distribution mostly stops at the first (tens to a thousand tokens), a broad one goes
# on; each step is one compare over the vocabulary.
LADDER = (9.0, 12.0, 16.0, 24.0, 32.0, 64.0)
TOTAL_SLACK = 1e-5  # the float32 total's relative error, with room: candidates must clear it
# top-p's buckets: a positive float64's bits are ordered like its value, so bits >> 46 is a
# bucket 1/64 of an octave wide (weights within 1.1% of each other), numbered from the heaviest.
BUCKET_SHIFT = 46
LAST_BUCKET = 8192  # 128 octaves below the heaviest and lower: one bucket, all but no mass


@dataclass(slots=True, frozen=True)
class Kept:
    """A distribution on a few tokens: ``probs`` (float64, > 0, summing to 1) on ``ids``
    (int64, ascending); every other token of the vocabulary has probability 0."""

    vocab_size: int
    ids: np.ndarray
    probs: np.ndarray

    def draw(self, rng: np.random.Generator) -> int:
        cum = np.cumsum(self.probs)
        pos = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
        return int(self.ids[min(pos, self.ids.shape[0] - 1)])  # past the end: the float edge

    def dense(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.float64)
        out[self.ids] = self.probs
        return out


@dataclass(slots=True, frozen=True)
class Softmax:
    """The whole vocabulary's softmax (temperature alone): ``shifted`` [vocab] float32 scaled
    logits minus their maximum, ``weights`` their float32 ``exp``, ``block_cum`` the running
    float64 total of ``weights`` per :data:`BLOCK` tokens."""

    shifted: np.ndarray
    weights: np.ndarray
    block_cum: np.ndarray

    @classmethod
    def of(cls, shifted: np.ndarray) -> Softmax:
        weights = np.exp(shifted)
        return cls(shifted, weights, block_cum(weights))

    def draw(self, rng: np.random.Generator) -> int:
        cum = self.block_cum
        target = rng.random() * cum[-1]
        b = int(np.searchsorted(cum, target, side="right"))
        if b >= cum.shape[0]:  # the float edge at the very end: the last block with mass
            b = int(np.flatnonzero(np.diff(cum, prepend=0.0))[-1])
        lo = b * BLOCK
        w = np.exp(self.shifted[lo : lo + BLOCK], dtype=np.float64)
        inner = (cum[b - 1] if b else 0.0) + np.cumsum(w)
        pos = int(np.searchsorted(inner, target, side="right"))
        if pos >= w.shape[0]:  # float32 block sum above its float64 one: its last token
            pos = int(np.flatnonzero(w)[-1])
        return lo + pos

    def dense(self) -> np.ndarray:
        probs = np.exp(self.shifted, dtype=np.float64)
        return probs / probs.sum()


SamplingDist = Kept | Softmax


def block_cum(weights: np.ndarray) -> np.ndarray:
    """Running float64 total of float32 ``weights`` per :data:`BLOCK` (the last block short)."""
    n = weights.shape[0]
    full = n - n % BLOCK
    sums = weights[:full].reshape(-1, BLOCK).sum(axis=1)
    if full < n:
        sums = np.append(sums, weights[full:].sum())
    return np.cumsum(sums, dtype=np.float64)


def sampling_dist(params: SamplingParams, x: np.ndarray) -> SamplingDist:
    """What a request with ``params`` draws from, given its (penalised, masked) [vocab] logits."""
    x = np.asarray(x, dtype=np.float32)
    if params.greedy:
        return point(x)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = x / np.float32(params.temperature)
    top = np.max(scaled)
    if not np.isfinite(top):
        # A temperature so small that the scaled logits overflow float32: its limit, the argmax.
        return point(x)
    n = scaled.shape[0]
    if 0 < params.top_k < n:
        ids = _top_k_ids(scaled, top, params.top_k)
        shifted = scaled[ids] - top  # the global maximum is among them
        return _within(params, n, ids, np.exp(shifted, dtype=np.float64))
    shifted = np.subtract(scaled, top, out=scaled)
    if params.min_p > 0.0:
        log_min = math.log(params.min_p)
        ids = np.flatnonzero(shifted >= np.float32(log_min - 1e-3 - 1e-6 * abs(log_min)))
        return _within(params, n, ids, np.exp(shifted[ids], dtype=np.float64))
    if params.top_p < 1.0:
        return _nucleus(shifted, params.top_p)
    return Softmax.of(shifted)


def point(x: np.ndarray) -> Kept:
    """All the probability on the argmax of ``x`` (first index on ties)."""
    return Kept(x.shape[0], np.array([int(np.argmax(x))]), np.ones(1))


def _top_k_ids(scaled: np.ndarray, top: np.float32, k: int) -> np.ndarray:
    """Ascending ids of every token whose scaled logit is at least the k-th largest."""
    for distance in LADDER:
        ids = np.flatnonzero(scaled >= top - np.float32(distance))
        if ids.shape[0] >= k:  # all the k largest are in: the k-th largest is theirs
            break
    else:
        ids = np.arange(scaled.shape[0])
    vals = scaled[ids]
    kth = np.partition(vals, vals.shape[0] - k)[vals.shape[0] - k]
    return ids[vals >= kth]


def _within(params: SamplingParams, n: int, ids: np.ndarray, w: np.ndarray) -> Kept:
    """min-p and top-p on candidates ``ids`` that hold all the mass (top-k or min-p cut the
    rest), ``w`` their float64 ``exp`` of the shifted logits (the maximum's is exactly 1).

    The weights stay unnormalised: min-p compares them with ``min_p`` itself and top-p sums
    them, so equal logits (weights of exactly 1) put the cut exactly where the definition does
    in real numbers."""
    if params.min_p > 0.0:
        w[w < params.min_p * w.max()] = 0.0
    if params.top_p < 1.0:
        keep = _head(w, params.top_p * w.sum())
        ids, w = ids[keep], w[keep]
    return _kept(n, ids, w)


def _nucleus(shifted: np.ndarray, top_p: float) -> Kept:
    """top-p alone: the candidates nearest the maximum that hold ``top_p`` of the total mass."""
    total = block_cum(np.exp(shifted))[-1]
    need = top_p * total
    for distance in LADDER:
        ids = np.flatnonzero(shifted >= np.float32(-distance))
        w = np.exp(shifted[ids], dtype=np.float64)
        if w.sum() >= need * (1.0 + TOTAL_SLACK):
            keep = _head(w, need)
            return _kept(shifted.shape[0], ids[keep], w[keep])
    # So flat (or top_p so near 1) that the candidates never clear it: every token.
    w = np.exp(shifted, dtype=np.float64)
    keep = _head(w, top_p * w.sum())
    return _kept(shifted.shape[0], keep, w[keep])


def _head(w: np.ndarray, need: float) -> np.ndarray:
    """Ascending positions of the shortest head of ``w`` (heaviest first, lower position first
    among equal weights) whose cumulative mass reaches ``need`` (all of ``w`` if none does)."""
    keys = w.view(np.int64) >> BUCKET_SHIFT  # w >= 0: ordered like w
    buckets = np.minimum(keys.max() - keys, LAST_BUCKET)  # 0: the heaviest weights
    cum = np.cumsum(np.bincount(buckets, weights=w))
    cut = min(int(np.searchsorted(cum, need)), cum.shape[0] - 1)  # the bucket reaching need
    inside = np.flatnonzero(buckets == cut)
    order = inside[np.argsort(-w[inside], kind="stable")]
    running = (cum[cut - 1] if cut else 0.0) + np.cumsum(w[order])
    take = min(int(np.searchsorted(running, need)) + 1, order.shape[0])  # at least one token
    return np.sort(np.concatenate([np.flatnonzero(buckets < cut), order[:take]]))


def _kept(n: int, ids: np.ndarray, w: np.ndarray) -> Kept:
    nonzero = w > 0.0
    if not nonzero.all():
        ids, w = ids[nonzero], w[nonzero]
    return Kept(n, ids.astype(np.int64, copy=False), w / w.sum())
