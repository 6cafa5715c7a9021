"""The truncated sampler (sampling_dist: candidates first, sort only those) is the full-sort
definition (exact_sampling_probs): the same distribution, the same tokens from the same seed,
and penalties that touch only the tokens seen give the full-array ones."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from localinfer.engine.sampler import (
    TokenSampler,
    draw,
    exact_sampling_probs,
    sampling_dist,
    sampling_probs,
)
from localinfer.engine.sampling_dist import Kept, Softmax
from localinfer.engine.types import SamplingParams

VOCABS = (1, 2, 3, 7, 64, 600, 3000)
TEMPERATURES = (0.05, 0.7, 1.0, 2.5)
CUTS = (
    {},
    {"top_p": 0.95},
    {"top_p": 0.5},
    {"top_p": 0.05},
    {"top_k": 1},
    {"top_k": 40},
    {"top_k": 5000},
    {"min_p": 0.05},
    {"min_p": 0.5},
    {"top_k": 40, "top_p": 0.9},
    {"min_p": 0.02, "top_p": 0.8},
    {"top_k": 20, "min_p": 0.1, "top_p": 0.7},
)


def random_logits(rng: np.random.Generator, vocab: int) -> np.ndarray:
    """Continuous logits (no ties) at a random spread, sometimes with a few far ahead (peaked,
    like a language model) and sometimes some masked to -inf."""
    x = rng.standard_normal(vocab) * rng.choice([0.3, 2.0, 6.0])
    if rng.random() < 0.5:
        x[rng.integers(vocab, size=max(1, vocab // 50))] += rng.uniform(3.0, 12.0)
    if vocab > 1 and rng.random() < 0.3:
        x[rng.random(vocab) < 0.4] = -np.inf
        x[rng.integers(vocab)] = 1.0  # one finite logit at least
    return x.astype(np.float32)


def assert_same(params: SamplingParams, x: np.ndarray) -> None:
    new, ref = sampling_probs(params, x), exact_sampling_probs(params, x)
    assert new.shape == ref.shape and new.dtype == np.float64
    np.testing.assert_array_equal(np.flatnonzero(new), np.flatnonzero(ref))
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-15)
    assert new.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_distribution_is_the_full_sort_definition(cut: dict) -> None:
    rng = np.random.default_rng(sum(map(ord, str(cut))))
    for trial in range(40):
        vocab = VOCABS[trial % len(VOCABS)]
        params = SamplingParams(temperature=float(rng.choice(TEMPERATURES)), **cut)
        assert_same(params, random_logits(rng, vocab))


def test_large_vocabularies_and_flat_heads_take_the_same_cut() -> None:
    # Flat logits: the top-p head grows past its first selection; peaked ones: it does not.
    rng = np.random.default_rng(7)
    for vocab in (49_152, 151_936):
        for spread in (0.2, 1.0, 3.0):
            x = (rng.standard_normal(vocab) * spread).astype(np.float32)
            for cut in ({"top_p": 0.95}, {"top_p": 0.3}, {"min_p": 0.05, "top_p": 0.9}):
                assert_same(SamplingParams(temperature=0.7, **cut), x)


def test_ties_at_the_cut_keep_the_lower_ids() -> None:
    # top-k keeps every token equal to the k-th: 4 tokens for k=2.
    x = np.array([3.0, 2.0, 2.0, 2.0, 1.0], np.float32)
    p = sampling_probs(SamplingParams(temperature=1.0, top_k=2), x)
    assert np.flatnonzero(p).tolist() == [0, 1, 2, 3]
    # top-p through a tie group: e, 1, 1, 1, 1/e (weights); 0.7 of the total needs the first
    # two of the tied three, and the lower ids go first.
    x = np.array([1.0, 0.0, 0.0, 0.0, -1.0], np.float32)
    p = sampling_probs(SamplingParams(temperature=1.0, top_p=0.7), x)
    assert np.flatnonzero(p).tolist() == [0, 1, 2]
    # Equal logits: the lowest ceil(top_p * n) ids; min-p 1 keeps every maximum.
    p = sampling_probs(SamplingParams(temperature=0.7, top_p=0.55), np.zeros(10, np.float32))
    assert np.flatnonzero(p).tolist() == list(range(6))
    x = np.array([0.0, 2.0, 1.0, 2.0, 2.0], np.float32)
    p = sampling_probs(SamplingParams(temperature=1.0, min_p=1.0), x)
    assert np.flatnonzero(p).tolist() == [1, 3, 4]
    # Many ties sharing their value range with slightly lighter tokens (one bucket): the cut
    # through them still takes the lowest ids of the heaviest first.
    x = np.zeros(401, np.float32)
    x[0], x[2::2] = 1.3, -0.002  # weights 1 (id 0), then 0.2725 (odd ids), 0.2720 (even ids)
    for cut in ({"top_p": 0.3}, {"top_p": 0.3, "min_p": 0.2}, {"top_p": 0.3, "top_k": 300}):
        params = SamplingParams(temperature=1.0, **cut)
        assert np.flatnonzero(sampling_probs(params, x)).tolist() == [0, *range(1, 2 * 118, 2)]
        assert_same(params, x)
    for params in (
        SamplingParams(temperature=1.0, top_k=2),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=0.7, top_p=0.55),
        SamplingParams(temperature=1.0, min_p=1.0, top_p=0.5),
    ):
        for x in (np.array([3, 2, 2, 2, 1], np.float32), np.round(np.linspace(-3, 3, 40))):
            assert_same(params, x.astype(np.float32))


@pytest.mark.parametrize("n, top_p", [(100, 0.5), (8, 0.375), (64, 0.25), (1000, 0.75)])
def test_a_cut_exactly_on_the_mass_is_the_definition_in_real_numbers(n: int, top_p: float) -> None:
    """Equal logits whose mass reaches top_p exactly at some head (top_p * n a whole number in
    floats too): the shortest such head, the lowest ids. The full-sort code sums normalised
    floats, 1/n each, and may take one token more."""
    for cut in ({"top_p": top_p}, {"top_p": top_p, "top_k": n}, {"top_p": top_p, "min_p": 0.5}):
        p = sampling_probs(SamplingParams(temperature=1.0, **cut), np.zeros(n, np.float32))
        head = next(k for k in range(1, n + 1) if Fraction(k, n) >= Fraction(top_p))
        assert np.flatnonzero(p).tolist() == list(range(head))


def test_edges_tiny_vocabularies_masks_and_no_cut() -> None:
    one = np.array([0.5], np.float32)
    for cut in CUTS:
        assert sampling_probs(SamplingParams(temperature=0.7, **cut), one).tolist() == [1.0]
    masked = np.array([-np.inf, 1.0, -np.inf, 0.5, -np.inf], np.float32)
    for cut in CUTS:
        params = SamplingParams(temperature=1.0, **cut)
        assert_same(params, masked)
        assert sampling_probs(params, masked)[[0, 2, 4]].tolist() == [0.0, 0.0, 0.0]
    x = np.linspace(-2, 2, 700).astype(np.float32)
    for params in (
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0),
        SamplingParams(temperature=1.0, top_k=700),
        SamplingParams(temperature=1.0, top_k=10**9),
        SamplingParams(temperature=1.0, top_p=0.9999999),  # past the candidates' slack
    ):
        assert_same(params, x)
    spread = np.linspace(-2000, 0, 100).astype(np.float32)  # few near the top: the ladder runs out
    assert_same(SamplingParams(temperature=1.0, top_k=50), spread)
    assert isinstance(sampling_dist(SamplingParams(temperature=1.0), x), Softmax)
    assert isinstance(sampling_dist(SamplingParams(temperature=1.0, top_p=0.9), x), Kept)
    for t in (1e-40, 5e-324):  # overflowing the scaled logits: the argmax
        p = sampling_probs(SamplingParams(temperature=t, top_p=0.5), x)
        assert p.argmax() == 699 and p.max() == 1.0
    assert sampling_probs(SamplingParams(), x).argmax() == 699  # greedy


def reference_draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """The inverse CDF over every id, as the full-sort sampler drew."""
    cum = np.cumsum(probs)
    token = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    if token >= probs.shape[0] or probs[token] == 0.0:
        token = int(np.flatnonzero(probs)[-1])
    return token


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_seeded_draws_are_the_full_sort_samplers_token_for_token(cut: dict) -> None:
    rng = np.random.default_rng(11)
    for vocab in (5, 600, 3000):  # 3000: the whole-vocabulary draw crosses blocks
        x = random_logits(rng, vocab)
        params = SamplingParams(temperature=0.8, **cut)
        dist, ref = sampling_dist(params, x), exact_sampling_probs(params, x)
        new_rng, ref_rng, dense_rng = (np.random.default_rng(5) for _ in range(3))
        new = [dist.draw(new_rng) for _ in range(300)]
        assert new == [reference_draw(ref, ref_rng) for _ in range(300)]
        assert new == [draw(dist.dense(), dense_rng) for _ in range(300)]


def test_a_seeded_sampler_reproduces_and_matches_the_definition() -> None:
    rng = np.random.default_rng(3)
    rows = [random_logits(rng, 2000) for _ in range(30)]
    params = SamplingParams(temperature=0.7, top_p=0.95, seed=9)
    a = [TokenSampler(params, 2000, []).sample(r).token_id for r in rows]
    one = TokenSampler(params, 2000, [])
    b = [one.sample(r).token_id for r in rows]
    ref_rng = np.random.default_rng(9)
    ref = [reference_draw(exact_sampling_probs(params, r), ref_rng) for r in rows]
    assert b == ref
    assert a == [
        reference_draw(exact_sampling_probs(params, r), np.random.default_rng(9)) for r in rows
    ]


def full_array_penalties(
    params: SamplingParams, raw: np.ndarray, prompt: list[int], outputs: list[int]
) -> np.ndarray:
    """Penalties as vocabulary-sized arrays of seen flags and counts."""
    seen = np.zeros(raw.shape[0], dtype=bool)
    counts = np.zeros(raw.shape[0], dtype=np.int32)
    seen[prompt] = True
    for t in outputs:
        seen[t] = True
        counts[t] += 1
    x = raw.copy()
    if params.repetition_penalty != 1.0:
        idx = np.flatnonzero(seen)
        vals = x[idx]
        x[idx] = np.where(
            vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty
        )
    if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        idx = np.flatnonzero(counts)
        x[idx] -= params.presence_penalty + params.frequency_penalty * counts[idx]
    return x


@pytest.mark.parametrize(
    "kw",
    [
        {"repetition_penalty": 1.3},
        {"presence_penalty": 0.7},
        {"frequency_penalty": -0.4},
        {"repetition_penalty": 0.8, "presence_penalty": -1.0, "frequency_penalty": 0.3},
    ],
)
def test_penalties_on_the_seen_tokens_are_the_full_array_ones(kw: dict) -> None:
    rng = np.random.default_rng(4)
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1, **kw)
    prompt = rng.integers(0, 500, size=60).tolist()
    sampler, outputs = TokenSampler(params, 500, prompt), []
    for _ in range(40):
        raw = (rng.standard_normal(500) * 2).astype(np.float32)
        np.testing.assert_array_equal(
            sampler.penalised(raw), full_array_penalties(params, raw, prompt, outputs)
        )
        outputs.append(sampler.sample(raw).token_id)
    assert len(set(outputs)) > 5  # the counts saw repeats and new tokens alike
