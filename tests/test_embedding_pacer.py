"""The embedding pacer (localinfer/engine/embedding.py): beside decoding streams a job runs small
slices within a share of the engine's time; alone it takes the step's whole prefill budget.

A hand-driven clock stands for the engine's time: each simulated step spends ``step`` seconds on
the streams, then asks the pacer, then spends ``per_token`` seconds per token it allowed.
"""

from __future__ import annotations

import pytest

from localinfer.engine.embedding import EMBED_SLICE_TOKENS, EMBED_TIME_SHARE, EmbeddingPacer


class HandClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(
    pacer: EmbeddingPacer, clock: HandClock, steps: int, step: float, per_token: float
) -> list[int]:
    """Budgets of ``steps`` decoding steps (0: no feed that step)."""
    budgets = []
    for _ in range(steps):
        clock.now += step
        budget = pacer.budget(left=256, decoding=True)
        if budget:
            clock.now += budget * per_token
            pacer.fed(budget)
        budgets.append(budget)
    return budgets


@pytest.mark.parametrize(
    ("step", "per_token", "cheap"),
    [
        (0.011, 0.0025, False),  # torch, one thread: an 8-token slice costs ~4 steps' credit
        (0.019, 0.0082, False),  # llama.cpp, one thread: ~7 steps' credit
        (0.010, 0.00025, True),  # cheap feeds (as on a GPU): 8 tokens cost 2 of 5 ms of credit
    ],
)
def test_feeds_beside_decoding_take_their_share_of_the_time(
    step: float, per_token: float, cheap: bool
) -> None:
    clock = HandClock()
    pacer = EmbeddingPacer(share=0.5, slice_tokens=8, clock=clock)
    budgets = run_steps(pacer, clock, 400, step, per_token)
    assert budgets[0] == 8  # a job beside a stream starts at once
    job_time = sum(budgets) * per_token
    streams_time = 400 * step
    # Half the streams' time, within one slice: the first runs at once, later ones repay.
    biggest = max(budgets) * per_token
    assert 0.5 * streams_time - biggest - step <= job_time <= 0.5 * streams_time + biggest
    fed = [b for b in budgets if b]
    if cheap:  # slices grow to what a step's credit pays for, and feeds run (nearly) every step
        assert max(fed) > 8 and len(fed) >= 0.95 * len(budgets)
    else:  # the smallest slice, every few steps
        assert set(fed) == {8} and len(fed) <= 0.3 * len(budgets)


def test_with_no_stream_decoding_a_job_takes_the_whole_budget_uncharged() -> None:
    clock = HandClock()
    pacer = EmbeddingPacer(share=0.5, slice_tokens=8, clock=clock)
    for left in (256, 40, 0, -3):
        clock.now += 1.0
        assert pacer.budget(left=left, decoding=False) == max(1, left)
        clock.now += 5.0  # a long feed: nobody is waiting for it
        pacer.fed(max(1, left))
        assert pacer.credit == 0.0
    # Streams start: the first slice runs at once, the long feeds before are not held against it.
    clock.now += 0.01
    assert pacer.budget(left=256, decoding=True) == 8


def test_a_slice_is_cut_to_what_prompts_left_but_never_to_nothing() -> None:
    clock = HandClock()
    pacer = EmbeddingPacer(share=0.5, slice_tokens=8, clock=clock)
    assert pacer.budget(left=3, decoding=True) == 3
    pacer.fed(3)
    clock.now += 1.0
    assert pacer.budget(left=0, decoding=True) == 1  # prompts took the budget: one token still


def test_time_before_a_job_is_not_banked() -> None:
    """Between jobs the engine decodes alone: that time is not credit for the next job."""
    clock = HandClock()
    pacer = EmbeddingPacer(share=0.5, slice_tokens=8, clock=clock)
    run_steps(pacer, clock, 10, step=0.25, per_token=0.0625)  # binary fractions: exact sums
    pacer.reset()  # the job ended
    clock.now += 60.0  # a minute of streams alone
    budgets = run_steps(pacer, clock, 8, step=0.25, per_token=0.0625)
    assert budgets == [8, 0, 0, 0, 8, 0, 0, 0]  # a 0.5 s slice repaid at 0.125 s a step


def test_defaults_and_bad_settings() -> None:
    pacer = EmbeddingPacer()
    assert (pacer.share, pacer.slice_tokens) == (EMBED_TIME_SHARE, EMBED_SLICE_TOKENS)
    with pytest.raises(ValueError, match="share"):
        EmbeddingPacer(share=0)
    with pytest.raises(ValueError, match="slice_tokens"):
        EmbeddingPacer(slice_tokens=0)
