"""TokenSampler: greedy, temperature/top-k/top-p/min-p, penalties, seeds and logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from localinfer.engine.sampler import TokenSampler
from localinfer.engine.types import SamplingParams


def sampler(prompt: tuple[int, ...] = (), vocab: int = 8, **kw: object) -> TokenSampler:
    return TokenSampler(SamplingParams(**kw), vocab, prompt)  # type: ignore[arg-type]


def draws(s: TokenSampler, logits: np.ndarray, n: int) -> np.ndarray:
    return np.array([s.sample(logits).token_id for _ in range(n)])


LOGITS = np.log(np.array([0.05, 0.4, 0.25, 0.15, 0.1, 0.05, 0.0, 0.0]) + 1e-12).astype(np.float32)


def test_greedy_is_argmax_with_first_index_on_ties() -> None:
    assert sampler(vocab=4).sample(np.array([0.0, 2.0, 1.0, 2.0], np.float32)).token_id == 1
    assert sampler().sample(LOGITS[None, :]).token_id == 1  # [1, vocab] rows accepted


def test_temperature_sampling_follows_the_softmax() -> None:
    s = sampler(temperature=1.0, seed=0)
    counts = np.bincount(draws(s, LOGITS, 20000), minlength=8) / 20000
    expected = np.exp(LOGITS) / np.exp(LOGITS).sum()
    np.testing.assert_allclose(counts, expected, atol=0.015)
    assert counts[6] == 0 and counts[7] == 0


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 1e-45, 1e-300, 5e-324])
def test_a_vanishing_temperature_is_the_argmax(temperature: float) -> None:
    """Its limit: the scaled logits overflow float32 (or the temperature rounds to 0.0 there),
    which used to make every probability NaN and the draw land on the vocabulary's last id."""
    masked = LOGITS.copy()
    masked[0] = -np.inf  # a constraint's mask: stays out
    for logits in (LOGITS, masked, LOGITS[::-1] + 40.0):  # one maximum each
        s = sampler(temperature=temperature, seed=3)
        assert set(draws(s, logits, 20)) == {int(np.argmax(logits))}


def test_seed_reproduces_and_different_seeds_differ() -> None:
    a = draws(sampler(temperature=1.0, seed=42), LOGITS, 50)
    b = draws(sampler(temperature=1.0, seed=42), LOGITS, 50)
    c = draws(sampler(temperature=1.0, seed=43), LOGITS, 50)
    assert (a == b).all() and not (a == c).all()


def test_top_k_top_p_min_p_cut_the_tail() -> None:
    only_best = draws(sampler(temperature=2.0, top_k=1, seed=1), LOGITS, 200)
    assert set(only_best) == {1}
    top2 = draws(sampler(temperature=1.0, top_k=2, seed=1), LOGITS, 2000)
    assert set(top2) == {1, 2}
    # top_p 0.6: 0.4 + 0.25 reach it, so tokens 1 and 2 only.
    nucleus = draws(sampler(temperature=1.0, top_p=0.6, seed=1), LOGITS, 2000)
    assert set(nucleus) == {1, 2}
    tiny_p = draws(sampler(temperature=1.0, top_p=0.01, seed=1), LOGITS, 200)
    assert set(tiny_p) == {1}
    # min_p 0.3: keep p >= 0.3 * 0.4 = 0.12 -> tokens 1, 2, 3.
    minp = draws(sampler(temperature=1.0, min_p=0.3, seed=1), LOGITS, 3000)
    assert set(minp) == {1, 2, 3}


def test_repetition_penalty_covers_prompt_and_output() -> None:
    logits = np.array([2.0, 1.9, -1.0, -1.2], np.float32)
    assert sampler(vocab=4).sample(logits).token_id == 0
    s = sampler(prompt=(0,), vocab=4, repetition_penalty=1.2)
    assert s.sample(logits).token_id == 1  # 2.0 / 1.2 < 1.9
    assert s.sample(logits).token_id == 0  # 1 is now penalised too: 1.583 < 1.667
    neg = sampler(prompt=(2,), vocab=4, repetition_penalty=2.0)
    assert neg.sample(np.array([-3.0, -2.5, -1.0, -1.5], np.float32)).token_id == 3  # -1 * 2 = -2


def test_presence_and_frequency_penalties_count_output_only() -> None:
    logits = np.array([1.0, 0.5, 0.0], np.float32)
    s = sampler(prompt=(0, 0, 0), vocab=3, presence_penalty=0.6)
    # The prompt's 0s are not counted: 0 wins, then 1.0 - 0.6 < 0.5, then 0.5 - 0.6 < 0.4.
    assert [s.sample(logits).token_id for _ in range(3)] == [0, 1, 0]
    f = sampler(vocab=3, frequency_penalty=0.3)
    # 0: 1.0, then 0.7, 0.4 ... token 1 stays 0.5 until used.
    assert [f.sample(logits).token_id for _ in range(4)] == [0, 0, 1, 0]


def test_logprobs_are_the_model_distribution() -> None:
    s = sampler(logprobs=3, repetition_penalty=2.0, prompt=(1,))
    out = s.sample(LOGITS)
    ref = LOGITS.astype(np.float64) - np.log(np.exp(LOGITS.astype(np.float64)).sum())
    assert out.token_id == 2  # the penalty moved the choice ...
    assert out.logprob == pytest.approx(ref[2])  # ... not the reported distribution
    assert [t for t, _ in out.top] == [1, 2, 3]
    assert [lp for _, lp in out.top] == pytest.approx(ref[[1, 2, 3]].tolist())
    zero = sampler(logprobs=0).sample(LOGITS)
    assert zero.top == () and zero.logprob == pytest.approx(ref[1])
    assert sampler().sample(LOGITS).logprob is None


def test_bad_logits_raise() -> None:
    with pytest.raises(ValueError, match="finite"):
        sampler().sample(np.full(8, np.nan, np.float32))
    with pytest.raises(ValueError, match="vocab"):
        sampler().sample(np.zeros(4, np.float32))


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty"])
def test_nan_and_infinity_are_refused_as_not_finite(field: str) -> None:
    """NaN fails every bound, so it was refused as 'less than or equal to 5'."""
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number"):
            SamplingParams(**{field: value})


def test_repetition_penalty_below_its_floor_is_refused() -> None:
    """5e-324 passed 'greater than 0' and rounded to a float32 zero: seen logits became inf."""
    with pytest.raises(ValueError, match="greater than or equal to 0.01"):
        SamplingParams(repetition_penalty=5e-324)
    s = sampler(prompt=(0, 1), vocab=4, repetition_penalty=0.01)
    x = s.penalised(np.array([100.0, -100.0, 1.0, 0.0], np.float32))
    assert np.isfinite(x).all()
