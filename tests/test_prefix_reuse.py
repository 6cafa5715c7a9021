"""Prefix reuse: a new request takes the idle slot sharing the longest prefix with its prompt and
prefills only the rest, and what it generates is what a cold prefill would give.

Policy and bookkeeping on the deterministic HashRunner (exact: its logits are a hash of the whole
cached context, so any wrong reuse changes the tokens). On the real runners:
test_prefix_reuse_runners.py.
"""

from __future__ import annotations

import pytest

from localinfer.backends.base import SlotWork
from localinfer.engine import Request
from tests.prefix_reuse_helpers import greedy, manual, seq, slot_cache
from tests.test_engine import reference_greedy, run_to_end
from tests.test_engine_model import HashRunner

# -- policy and bookkeeping (HashRunner, exact) -------------------------------------------------


def test_next_turn_takes_its_conversation_slot_and_prefills_only_the_new_tokens() -> None:
    runner = HashRunner(slots=3)
    engine = manual(runner, prefill_chunk=8)
    p1 = seq(30, 1)
    a1 = engine.generate(Request(p1, greedy(7)))
    engine.generate(Request(seq(12, 2), greedy(4)))  # another conversation in another slot
    p2 = p1 + list(a1.token_ids) + seq(13, 3)  # the template adds the user's next message
    h = engine.submit(Request(p2, greedy(9)))
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    # The answer's last token was sampled but never fed, so it is the first token prefilled.
    reuse = len(p1) + 7 - 1
    assert reports[0].reused == {h.request_id: reuse}
    assert sum(r.prefilled.get(h.request_id, 0) for r in reports) == len(p2) - reuse
    first_work = runner.batches[-len(reports)][0]
    assert first_work.slot == 0 and first_work.start_pos == reuse
    res = h.result()
    assert list(res.token_ids) == reference_greedy(p2, 9)
    assert res.metrics is not None and res.metrics.cached_tokens == reuse
    # The slot now caches the new turn: prompt + all but the last answer token.
    assert slot_cache(engine, 0) == p2 + list(res.token_ids)[:-1]


def test_divergence_inside_the_cache_truncates_to_the_shared_prefix() -> None:
    runner = HashRunner(slots=2)
    engine = manual(runner)
    p1 = seq(40, 4)
    engine.generate(Request(p1, greedy(5)))
    p2 = p1[:17] + seq(10, 5)  # shares 17 tokens, then differs (an edited earlier message)
    assert p2[17] != p1[17]
    res = engine.generate(Request(p2, greedy(6)))
    assert list(res.token_ids) == reference_greedy(p2, 6)
    assert res.metrics is not None and res.metrics.cached_tokens == 17
    assert runner.batches[-6][0].start_pos == 17  # first forward of p2 after truncation
    assert runner.slot_length(0) == len(p2) + 5 == len(slot_cache(engine, 0))


def test_a_wholly_cached_prompt_still_feeds_its_last_token() -> None:
    runner = HashRunner(slots=1)
    engine = manual(runner)
    p = seq(25, 6)
    first = engine.generate(Request(p, greedy(5)))
    again = engine.generate(Request(p, greedy(5)))  # same prompt: cache holds p + 4 answer tokens
    assert again.token_ids == first.token_ids
    assert again.metrics is not None and again.metrics.cached_tokens == len(p) - 1
    assert runner.batches[-5][0] == SlotWork(0, (p[-1],), len(p) - 1)
    shorter = engine.generate(Request(p[:10], greedy(3)))  # a strict prefix of the cache
    assert list(shorter.token_ids) == reference_greedy(p[:10], 3)
    assert shorter.metrics is not None and shorter.metrics.cached_tokens == 9


def test_a_short_prompt_sent_again_goes_back_to_its_slot() -> None:
    # Below MIN_TRANSFER tokens a match does not outrank an empty slot, unless it is the whole
    # prompt (a retry, a regenerated answer): then only the last token is fed.
    runner = HashRunner(slots=3)
    engine = manual(runner)
    p = seq(8, 7)
    first = engine.generate(Request(p, greedy(4)))
    again = engine.submit(Request(p, greedy(4)))
    report = engine.step()
    assert report.reused == {again.request_id: len(p) - 1}
    assert engine._scheduler.slots.slots[0].seq is not None  # its old slot, not an empty one
    run_to_end(engine)
    assert again.result().token_ids == first.token_ids
    # A short prompt sharing only its beginning with that slot still takes an empty one.
    other = engine.submit(Request(p[:5] + seq(3, 8), greedy(2)))
    assert other.request_id not in engine.step().reused
    assert engine._scheduler.slots.slots[0].seq is None
    run_to_end(engine)


def test_ties_and_misses_go_to_the_least_recently_used_slot() -> None:
    runner = HashRunner(slots=3)
    engine = manual(runner)
    header = [9, 8, 7, 6]
    users = [[5, *seq(8, 10)], header + seq(5, 11), header + seq(5, 12)]
    # Admitted together into slots 0, 1, 2; released in that order (2, 3, 4 tokens).
    handles = engine.submit_all([Request(p, greedy(2 + i)) for i, p in enumerate(users)])
    run_to_end(engine)
    assert [slot_cache(engine, s)[: len(p)] for s, p in enumerate(users)] == users
    assert [h.result().metrics.cached_tokens for h in handles] == [0, 0, 0]  # type: ignore[union-attr]
    # A miss goes to the least recently used slot (0).
    miss = engine.submit(Request([4, *seq(8, 20)], greedy(2)))
    engine.step()
    assert engine._scheduler.slots.slots[0].seq is not None
    run_to_end(engine)
    assert miss.result().metrics.cached_tokens == 0  # type: ignore[union-attr]
    # The header ties slots 1 and 2: the least recently used one (1) wins.
    tie = engine.submit(Request(header + seq(4, 30), greedy(2)))
    report = engine.step()
    assert report.reused == {tie.request_id: len(header)}
    assert engine._scheduler.slots.slots[1].seq is not None
    run_to_end(engine)
    # The longest prefix beats recency: a follow-up of users[2] goes to slot 2.
    follow_prompt = slot_cache(engine, 2) + seq(3, 40)
    follow = engine.submit(Request(follow_prompt, greedy(2)))
    engine.step()
    assert engine._scheduler.slots.slots[2].seq is not None
    run_to_end(engine)
    assert follow.result().metrics.cached_tokens == len(users[2]) + 3  # type: ignore[union-attr]
    assert list(follow.result().token_ids) == reference_greedy(follow_prompt, 2)


def test_concurrent_multi_turn_chats_match_cold_and_metrics_add_up() -> None:
    # Four chats of three turns on two slots with a small prefill budget: requests queue, prefill
    # in chunks beside decodes, and pick their slots by prefix; every answer equals the cold one.
    runner = HashRunner(slots=2)
    engine = manual(runner, prefill_chunk=8)
    chats = [seq(10 + 7 * i, 50 + i) for i in range(4)]
    cached: list[int] = []
    prompt_total = 0
    for turn in range(3):
        # Alternate the order, so the chats that finished last (still cached) come first.
        order = list(range(4)) if turn % 2 == 0 else [3, 2, 1, 0]
        handles = engine.submit_all([Request(chats[i], greedy(4 + turn)) for i in order])
        run_to_end(engine)
        for i, h in zip(order, handles, strict=True):
            res = h.result()
            assert list(res.token_ids) == reference_greedy(chats[i], 4 + turn)
            assert res.metrics is not None
            cached.append(res.metrics.cached_tokens)
            prompt_total += len(chats[i])
            chats[i] = chats[i] + list(res.token_ids) + seq(5, 100 * turn + i)
    assert sum(c > 0 for c in cached[4:]) == 4  # two chats per later turn found their slot
    m = engine.metrics()
    assert m.cached_prompt_tokens_total == sum(cached)
    assert m.prompt_tokens_total == prompt_total
    assert m.prefix_hits == sum(c > 0 for c in cached)
    assert m.prefix_hit_rate == pytest.approx(sum(cached) / prompt_total)
    # Idle slots keep their KV (that is the cache), and the engine's view matches the runner's.
    assert m.kv_cells_used == sum(runner.slot_length(s) for s in range(2)) > 0


def test_without_reuse_slots_start_empty_and_nothing_is_cached() -> None:
    runner = HashRunner(slots=1)
    engine = manual(runner, reuse=False)
    p = seq(20, 8)
    engine.generate(Request(p, greedy(3)))
    res = engine.generate(Request(p + [5, 6], greedy(3)))
    assert res.metrics is not None and res.metrics.cached_tokens == 0
    assert runner.batches[-3][0].start_pos == 0
    m = engine.metrics()
    assert (m.cached_prompt_tokens_total, m.prefix_hits, m.prefix_hit_rate) == (0, 0, 0.0)
    assert m.kv_cells_used == 0 and runner.slot_length(0) == 0
    assert manual(HashRunner()).metrics().prefix_hit_rate is None  # nothing finished yet


class StubbornRunner(HashRunner):
    """A runner whose memory refuses partial removal (as some backends' recurrent layers do)."""

    def truncate(self, slot: int, length: int) -> None:
        if 0 < length < self.slot_length(slot):
            raise RuntimeError("partial removal not supported")
        super().truncate(slot, length)


def test_a_runner_that_cannot_truncate_costs_the_reuse_not_correctness() -> None:
    runner = StubbornRunner(slots=1)
    engine = manual(runner)
    p = seq(20, 9)
    engine.generate(Request(p, greedy(4)))
    p2 = p[:12] + seq(6, 10)
    res = engine.generate(Request(p2, greedy(4)))
    assert list(res.token_ids) == reference_greedy(p2, 4)
    assert res.metrics is not None and res.metrics.cached_tokens == 0
    # Extending the cache needs no truncation, so the next turn still reuses.
    p3 = p2 + list(res.token_ids) + [7]
    again = engine.generate(Request(p3, greedy(4)))
    assert list(again.token_ids) == reference_greedy(p3, 4)
    assert again.metrics is not None and again.metrics.cached_tokens == len(p2) + 3


def test_an_aborted_prefill_leaves_a_reusable_prefix_and_a_failed_slot_is_emptied() -> None:
    runner = HashRunner(slots=1, fail_on_token=250)
    engine = manual(runner, prefill_chunk=8)
    p = seq(30, 11, vocab=240)
    h = engine.submit(Request(p, greedy(4)))
    engine.step()
    engine.step()  # 16 prompt tokens are in the cache
    h.abort()
    run_to_end(engine)
    assert h.result().finish_reason == "abort"
    res = engine.generate(Request(p, greedy(4)))
    assert list(res.token_ids) == reference_greedy(p, 4)
    assert res.metrics is not None and res.metrics.cached_tokens == 16
    # A forward that fails leaves the slot suspect: it is released, never reused.
    bad = engine.generate(Request(p + [250], greedy(2)))
    assert bad.finish_reason == "error"
    assert runner.slot_length(0) == 0 and slot_cache(engine, 0) == []
    res = engine.generate(Request(p, greedy(4)))
    assert list(res.token_ids) == reference_greedy(p, 4)
    assert res.metrics is not None and res.metrics.cached_tokens == 0
