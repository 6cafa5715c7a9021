"""Rejection sampling keeps the target's distribution: chi-square tests at the verification
function level (fast: a 6-token vocabulary and a first-order "model" given as logit tables),
including proof that the tests fail when acceptance is deliberately broken."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localinfer.engine.sampler import TokenSampler
from localinfer.engine.speculative import Proposal, verify
from localinfer.engine.speculative import verification as verify_module
from localinfer.engine.speculative.distribution import draw, proposal_probs, target_probs
from localinfer.engine.types import SamplingParams

V = 6
TEMPERATURE = 0.8
RNG = np.random.default_rng(1234)
TARGET = RNG.normal(0.0, 1.5, size=(V, V)).astype(np.float32)  # [prev, next] logits
DRAFT = RNG.normal(0.0, 1.5, size=(V, V)).astype(np.float32)  # a different model


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.719 is p = 1e-4."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(counts: np.ndarray, expected_p: np.ndarray) -> tuple[float, int]:
    n = counts.sum()
    support = expected_p > 0
    assert counts[~support].sum() == 0, "a token with probability 0 was drawn"
    e = n * expected_p[support]
    return float(((counts[support] - e) ** 2 / e).sum()), int(support.sum()) - 1


def expected_pairs() -> np.ndarray:
    """P(first two tokens = a, b) after token 0 under the target at TEMPERATURE: [V, V]."""
    p = np.array([softmax(TARGET[i] / TEMPERATURE) for i in range(V)])
    return p[0][:, None] * p


def sample_pairs(n: int, k: int, use_draft: bool, seed: int) -> np.ndarray:
    """Counts of the first two emitted tokens over n speculative generations."""
    params = SamplingParams(temperature=TEMPERATURE)
    rng = np.random.default_rng(seed)
    counts = np.zeros((V, V), dtype=np.int64)
    # The draft is first-order: its q after each token, computed once (the same rows each draft
    # step would compute again, and most of what this loop cost).
    draft_q = [proposal_probs(params, DRAFT[prev], V) for prev in range(V)]
    for _ in range(n):
        sampler = TokenSampler(params, V, [0])
        out: list[int] = []
        last = 0
        while len(out) < 2:
            tokens, rows, prev = [], [], last
            for _ in range(k):
                if use_draft:
                    q = draft_q[prev]
                    prev = draw(q, rng)
                    rows.append(q)
                else:  # a fixed "n-gram" guess: the token after prev in a cycle
                    prev = (prev + 1) % V
                tokens.append(prev)
            proposal = Proposal(tuple(tokens), np.stack(rows) if rows else None)
            logits = TARGET[[last, *tokens]]  # [k + 1, V]: row i follows tokens[:i]
            verdict = verify(sampler, proposal, logits, rng)
            out.extend(t.token_id for t in verdict.tokens)
            last = out[-1]
        counts[out[0], out[1]] += 1
    return counts


N = 5_000


@pytest.mark.parametrize(("use_draft", "k"), [(True, 2), (True, 3), (False, 2)])
def test_speculative_sampling_matches_the_target_distribution(use_draft: bool, k: int) -> None:
    counts = sample_pairs(N, k, use_draft, seed=k + 10 * use_draft)
    stat, df = chi2(counts.reshape(-1), expected_pairs().reshape(-1))
    assert stat < chi2_critical(df), (stat, df)


def _resample_from_p(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return p  # the classic bug: after a rejection, draw from p instead of max(p - q, 0)


@pytest.mark.parametrize("use_draft", [True, False])
def test_the_chi_square_test_catches_a_broken_residual(
    monkeypatch: pytest.MonkeyPatch, use_draft: bool
) -> None:
    monkeypatch.setattr(verify_module, "residual", _resample_from_p)
    # Half the samples the passing tests take, as below: caught with fewer is caught with N
    # (measured: 354 with a draft, 400 without, against the bound of 225; at N 654 and 731).
    counts = sample_pairs(N // 2, 2, use_draft, seed=3)
    stat, df = chi2(counts.reshape(-1), expected_pairs().reshape(-1))
    assert stat > 3 * chi2_critical(df), (stat, df)


def test_the_chi_square_test_catches_accepting_every_proposal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Accept whenever q > 0 (u * q < p replaced by always true): output follows the draft.
    class AlwaysAccept:
        def __init__(self, rng: np.random.Generator) -> None:
            self._rng = rng

        def random(self) -> float:
            return 0.0

        def __getattr__(self, name: str):
            return getattr(self._rng, name)

    real_verify = verify_module._verify_sampled

    def broken(sampler, proposal, logits, rng):
        return real_verify(sampler, proposal, logits, AlwaysAccept(rng))

    monkeypatch.setattr(verify_module, "_verify_sampled", broken)
    counts = sample_pairs(N // 2, 2, True, seed=4)
    stat, df = chi2(counts.reshape(-1), expected_pairs().reshape(-1))
    assert stat > 3 * chi2_critical(df), (stat, df)


PARAMS = [
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=3),
    dict(temperature=1.0, top_p=0.7),
    dict(temperature=0.9, min_p=0.2),
    dict(temperature=1.0, repetition_penalty=1.6),
    dict(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.5),
]


@pytest.mark.parametrize("kw", PARAMS)
def test_target_probs_is_what_the_sampler_draws_from(kw: dict) -> None:
    # The p of rejection sampling must be the request's own distribution, penalties included.
    params = SamplingParams(**kw)
    logits = TARGET[2] * 1.5
    history = [1, 1, 4]
    n = 2000
    counts = np.zeros(V, dtype=np.int64)
    for seed in range(n):
        sampler = TokenSampler(params.model_copy(update={"seed": seed}), V, [3, 4])
        for t in history:
            sampler.observe(t)
        counts[sampler.sample(logits).token_id] += 1
    sampler = TokenSampler(params, V, [3, 4])
    for t in history:
        sampler.observe(t)
    p = target_probs(sampler, logits)
    assert p.sum() == pytest.approx(1.0)
    stat, df = chi2(counts, p)
    assert stat < chi2_critical(max(df, 1)), (stat, p, counts / n)


def test_greedy_target_probs_is_the_penalised_argmax() -> None:
    params = SamplingParams(repetition_penalty=5.0)
    logits = np.array([0.0, 3.0, 2.9, -1.0, 0.5, 0.1], dtype=np.float32)
    sampler = TokenSampler(params, V, [1])  # token 1 is penalised below token 2
    p = target_probs(sampler, logits)
    assert p.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert sampler.sample(logits).token_id == 2


def test_greedy_verification_accepts_the_matching_prefix_plus_one() -> None:
    logits = np.full((4, V), -5.0, dtype=np.float32)
    for row, best in enumerate([3, 1, 4, 5]):
        logits[row, best] = 5.0
    cases = [((3, 1, 4), 3, [3, 1, 4, 5]), ((3, 2, 4), 1, [3, 1]), ((0, 1, 4), 0, [3])]
    for proposed, accepted, emitted in cases:
        sampler = TokenSampler(SamplingParams(logprobs=2), V, [0])
        verdict = verify(sampler, Proposal(proposed), logits)
        assert verdict.accepted == accepted
        assert [t.token_id for t in verdict.tokens] == emitted
        assert all(t.logprob is not None and len(t.top) == 2 for t in verdict.tokens)
    with pytest.raises(ValueError, match="logits rows"):
        verify(TokenSampler(SamplingParams(), V, [0]), Proposal((1, 2)), logits)
