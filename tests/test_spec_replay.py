"""The speculation replay model (bench/spec_replay.py) behind scripts/spec-replay."""

from __future__ import annotations

import numpy as np
import pytest

from bench.spec_replay import Recorded, fit_cost, interpolated_cost, replay
from localinfer.engine.speculative import SpecConfig

VOCAB = 1000


def _copying(n: int = 120) -> Recorded:
    rng = np.random.default_rng(0)
    text = tuple(int(t) for t in rng.integers(10, VOCAB, size=n))
    prompt = (1, 2, 3) + text + (4, 5)
    return Recorded("editing", prompt, text)  # the answer repeats the prompt's text


def test_interpolated_cost_is_linear_between_and_beyond_the_measured_points() -> None:
    cost = interpolated_cost({0: 1.0, 1: 2.0, 4: 3.5})
    assert cost(0) == 1.0
    assert cost(2) == pytest.approx(2.5)
    assert cost(6) == pytest.approx(4.5)  # the last slope (0.5 per token) carried on
    with pytest.raises(ValueError):
        interpolated_cost({1: 2.0, 2: 3.0})


def test_fit_cost_recovers_a_fixed_and_per_token_part() -> None:
    per_token, fixed = fit_cost({k: 1.0 + 0.6 + 0.25 * k for k in (1, 2, 4, 8, 16)})
    assert per_token == pytest.approx(0.25)
    assert fixed == pytest.approx(0.6)
    per_token, fixed = fit_cost({k: 1.0 + 0.1 * k - 0.05 for k in (1, 2, 4)})  # fixed < 0
    assert fixed == 0.0 and per_token > 0


def test_a_copied_answer_replays_faster_when_verification_is_cheap() -> None:
    rec = _copying()
    config = SpecConfig(verify_cost=0.05, ngram_min=2)
    cheap = replay(rec, config, interpolated_cost({0: 1.0, 16: 1.8}), VOCAB)
    assert cheap.verifications > 0 and cheap.accepted > 0.9 * cheap.proposed
    assert cheap.speedup > 3.0
    assert cheap.tokens == len(rec.answer) - 1


def test_replay_charges_what_the_cost_model_says() -> None:
    # Verifying k proposals costs k + 1 steps: speculation can at best break even, and the
    # replay must show that rather than a gain.
    rec = _copying()
    config = SpecConfig(verify_cost=1.0, min_gain=1.0)
    result = replay(rec, config, lambda k: 1.0 + k, VOCAB)
    assert result.speedup <= 1.0 + 1e-9


def test_free_text_stays_near_plain_speed() -> None:
    rng = np.random.default_rng(1)
    prompt = tuple(int(t) for t in rng.integers(10, VOCAB, size=60))
    answer = tuple(int(t) for t in rng.integers(10, VOCAB, size=100))
    result = replay(Recorded("chat", prompt, answer), SpecConfig(), lambda k: 1.5 + 0.4 * k, VOCAB)
    assert result.verifications == 0 and result.speedup == 1.0
