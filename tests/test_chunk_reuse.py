"""Chunk matching for --cache-reuse (localinfer/engine/kv/chunk_reuse.py ``plan_reuse``): which
cached chunks after the shared prefix a new prompt reuses, and what the slot holds once spliced.

Cases: no match, an insertion (the fill-in-the-middle case), a deletion, several chunks with new
tokens between them, a match shorter than N ignored, the last prompt token never in a chunk,
chunks in order in both sequences, the budget of new tokens, repeated windows, colliding hashes,
and random edits checked against the plan's invariants.
"""

from __future__ import annotations

import numpy as np
import pytest

from localinfer.engine.kv import chunk_reuse
from localinfer.engine.kv.chunk_reuse import ReusePlan, plan_reuse


def toks(n: int, seed: int, low: int = 1000) -> list[int]:
    """``n`` distinct-looking ids (a wide range, so random matches of 4+ tokens do not occur)."""
    return [int(t) for t in np.random.default_rng(seed).integers(low, low + 100_000, n)]


def layout(plan: ReusePlan, cached: list[int]) -> list[int]:
    """The tokens the slot holds after the splice, rebuilt from the plan and the cache."""
    out = list(cached[: plan.keep])
    for chunk in plan.chunks:
        out += list(chunk.new) + cached[chunk.start : chunk.end]
    return out


def check_plan(plan: ReusePlan, cached: list[int], prompt: list[int], n: int, max_new: int) -> None:
    """What every plan must satisfy."""
    assert layout(plan, cached) == prompt[: plan.end]
    assert plan.end <= len(prompt) - 1  # the last prompt token is always fed
    floor = plan.keep
    for chunk in plan.chunks:
        assert chunk.start >= floor and chunk.end - chunk.start >= n
        floor = chunk.end
    assert floor <= len(cached)
    assert plan.new_tokens <= max_new
    assert plan.reused == plan.end - plan.new_tokens


def test_no_match_or_off_keeps_only_the_prefix() -> None:
    cached, prompt = toks(200, 1), toks(180, 2)
    prompt[:30] = cached[:30]
    for n in (0, 8):
        plan = plan_reuse(cached, prompt, 30, n, 256)
        assert plan == ReusePlan(30, (), 30) and plan.reused == 30


def test_an_insertion_moves_the_rest_after_the_new_tokens() -> None:
    # The fill-in-the-middle case: a line typed in the middle; what follows it shifts.
    head, line, tail = toks(100, 1), toks(7, 2), toks(120, 3)
    answer = toks(8, 4)
    cached = head + tail + answer  # the previous request and its answer
    prompt = head + line + tail
    plan = plan_reuse(cached, prompt, 100, 16, 256)
    (chunk,) = plan.chunks
    assert chunk.new == tuple(line)
    # Everything of the tail but its last token, which is fed for the first new token's logits.
    assert (chunk.start, chunk.end) == (100, 100 + len(tail) - 1)
    assert plan.end == len(prompt) - 1 and plan.reused == len(head) + len(tail) - 1
    check_plan(plan, cached, prompt, 16, 256)


def test_a_deletion_moves_the_rest_down_with_nothing_new() -> None:
    head, cut, tail = toks(50, 1), toks(30, 2), toks(80, 3)
    cached, prompt = head + cut + tail, head + tail + toks(5, 4)
    plan = plan_reuse(cached, prompt, 50, 16, 256)
    (chunk,) = plan.chunks
    assert chunk.new == () and (chunk.start, chunk.end) == (80, 160)
    assert plan.end == 130 and plan.reused == 130
    check_plan(plan, cached, prompt, 16, 256)


def test_several_chunks_with_new_tokens_between_them() -> None:
    a, b, c, d = toks(40, 1), toks(30, 2), toks(25, 3), toks(35, 4)
    x, y, z = toks(3, 5), toks(9, 6), toks(4, 7)
    cached = a + b + toks(12, 8) + c + d
    prompt = a + x + b + y + c + z + d + toks(2, 9)
    plan = plan_reuse(cached, prompt, 40, 16, 256)
    assert [(c.new, c.end - c.start) for c in plan.chunks] == [
        (tuple(x), 30),
        (tuple(y), 25),
        (tuple(z), 35),
    ]
    assert plan.reused == 40 + 30 + 25 + 35 and plan.new_tokens == 3 + 9 + 4
    check_plan(plan, cached, prompt, 16, 256)


def test_a_match_shorter_than_n_is_ignored() -> None:
    a, short, long_ = toks(20, 1), toks(7, 2), toks(12, 3)
    cached = a + short + toks(5, 4) + long_
    prompt = a + toks(3, 5) + short + toks(2, 6) + long_ + toks(1, 7)
    plan = plan_reuse(cached, prompt, 20, 8, 256)
    (chunk,) = plan.chunks  # the 7-token match is fed with the new tokens around it
    assert cached[chunk.start : chunk.end] == long_
    assert chunk.new == tuple(prompt[20 : prompt.index(long_[0])])
    check_plan(plan, cached, prompt, 8, 256)
    # With N = 7 both are reused.
    assert len(plan_reuse(cached, prompt, 20, 7, 256).chunks) == 2


def test_the_last_prompt_token_is_never_in_a_chunk() -> None:
    a, tail = toks(30, 1), toks(40, 2)
    cached = a + tail
    prompt = a + toks(5, 3) + tail  # ends exactly where the cache does
    plan = plan_reuse(cached, prompt, 30, 8, 256)
    assert plan.end == len(prompt) - 1 and plan.chunks[-1].end == len(cached) - 1
    # A prompt whose last N tokens are the only match: too short once the last one is fed.
    assert plan_reuse(cached, a + toks(5, 3) + tail[-8:], 30, 8, 256).chunks == ()
    # keep already at the limit (a wholly cached prompt): nothing to plan.
    assert plan_reuse(cached, cached[:50], 49, 1, 256) == ReusePlan(49, (), 49)


def test_chunks_are_in_order_in_both_sequences() -> None:
    a, b, c = toks(20, 1), toks(30, 2), toks(30, 3)
    cached = a + b + c
    prompt = a + toks(2, 4) + c + b + toks(1, 5)  # b and c swapped: only one can move
    plan = plan_reuse(cached, prompt, 20, 8, 256)
    (chunk,) = plan.chunks
    assert cached[chunk.start : chunk.end] == c
    check_plan(plan, cached, prompt, 8, 256)


def test_new_tokens_stay_within_the_budget() -> None:
    a, b, c = toks(20, 1), toks(30, 2), toks(30, 3)
    x, y = toks(10, 4), toks(50, 5)
    cached, prompt = a + b + c, a + x + b + y + c + toks(1, 6)
    assert len(plan_reuse(cached, prompt, 20, 8, 60).chunks) == 2
    plan = plan_reuse(cached, prompt, 20, 8, 59)  # y no longer fits: c is prefilled normally
    assert [c_.new for c_ in plan.chunks] == [tuple(x)] and plan.end == 20 + 10 + 30
    assert plan_reuse(cached, prompt, 20, 8, 9).chunks == ()
    check_plan(plan, cached, prompt, 8, 59)


def test_repeated_windows_take_the_first_after_the_last_chunk() -> None:
    a, rep, b = toks(10, 1), toks(12, 2), toks(20, 3)
    cached = a + rep + b + rep + b
    prompt = a + toks(3, 4) + rep + b + rep + b + toks(1, 5)
    plan = plan_reuse(cached, prompt, 10, 8, 256)
    (chunk,) = plan.chunks  # one chunk runs through both repeats
    assert (chunk.start, chunk.end) == (10, len(cached))
    check_plan(plan, cached, prompt, 8, 256)


def test_colliding_hashes_are_checked_against_the_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    def same_hash(tokens: list[int], n: int) -> np.ndarray:
        return np.zeros(max(0, len(tokens) - n + 1), dtype=np.uint64)

    monkeypatch.setattr(chunk_reuse, "_window_hashes", same_hash)
    head, line, tail = toks(30, 1), toks(4, 2), toks(40, 3)
    cached, prompt = head + toks(9, 4) + tail, head + line + tail
    plan = plan_reuse(cached, prompt, 30, 8, 256)
    (chunk,) = plan.chunks
    assert chunk.new == tuple(line) and cached[chunk.start : chunk.end] == tail[:-1]
    check_plan(plan, cached, prompt, 8, 256)


@pytest.mark.parametrize("seed", range(40))
def test_random_edits_give_consistent_plans(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([4, 20, 5000]))  # small vocabularies repeat windows often
    cached = [int(t) for t in rng.integers(0, vocab, int(rng.integers(20, 300)))]
    prompt = list(cached)
    for _ in range(int(rng.integers(1, 6))):  # insert, delete or replace spans
        at = int(rng.integers(0, len(prompt) + 1))
        kind = rng.integers(0, 3)
        span = int(rng.integers(1, 30))
        if kind != 0:
            del prompt[at : at + span]
        if kind != 1:
            prompt[at:at] = [int(t) for t in rng.integers(0, vocab, span)]
    if len(prompt) < 2:
        prompt += [1, 2]
    keep = 0
    while keep < min(len(cached), len(prompt) - 1) and cached[keep] == prompt[keep]:
        keep += 1
    n, max_new = int(rng.integers(1, 12)), int(rng.integers(0, 80))
    check_plan(plan_reuse(cached, prompt, keep, n, max_new), cached, prompt, n, max_new)
