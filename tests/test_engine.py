"""Engine behaviour on a deterministic numpy model: batching parity, admission, interleaved
prefill, seeds, errors, aborts, metrics. Steps are driven by hand (background=False), so
assertions are on step counts, never on time."""

from __future__ import annotations

import re

import numpy as np
import pytest
from pydantic import ValidationError

from localinfer.backends.base import SlotWork
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.errors import ContextOverflowError, InvalidParameterError, QueueFullError
from tests.test_engine_model import ByteTokenizer, HashRunner, ScriptRunner


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


def reference_greedy(prompt: list[int], max_tokens: int, eos: int = 0, **runner_kw: object):
    """Greedy tokens computed by driving a fresh runner directly, one slot, no engine."""
    r = HashRunner(slots=1, **runner_kw)  # type: ignore[arg-type]
    out = r.forward([SlotWork(0, tuple(prompt), 0)])[0]
    tokens: list[int] = []
    while True:
        t = int(np.argmax(out[-1]))
        tokens.append(t)
        if t == eos or len(tokens) == max_tokens:
            return tokens
        out = r.forward([SlotWork(0, (t,), r.slot_length(0))])[0]


def manual_engine(runner: HashRunner | None = None, **kw: object) -> Engine:
    return Engine(runner or HashRunner(), ByteTokenizer(), background=False, **kw)  # type: ignore[arg-type]


def run_to_end(engine: Engine) -> int:
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    return steps


PROMPTS = [[3, 4, 5], list(range(10, 60)), [7], list(range(100, 113)), [9, 9, 9, 9, 9, 9]]
LENGTHS = [12, 5, 20, 9, 16]


def test_batched_equals_single_with_chunked_prefill_and_queueing() -> None:
    # 5 requests, 3 slots, a small prefill budget: requests wait, prefill in chunks beside decodes,
    # and finish at different times; each must still produce exactly its solo greedy tokens.
    engine = manual_engine(HashRunner(slots=3), prefill_chunk=8)
    handles = [engine.submit(Request(p, greedy(n))) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    run_to_end(engine)
    for h, p, n in zip(handles, PROMPTS, LENGTHS, strict=True):
        res = h.result()
        assert list(res.token_ids) == reference_greedy(p, n), h.request_id
        assert res.finish_reason == "length"
        assert res.metrics is not None and res.metrics.completion_tokens == n


def test_waiting_request_starts_within_one_step_of_a_slot_freeing() -> None:
    engine = manual_engine(HashRunner(slots=2))
    a = engine.submit(Request([1, 2], greedy(3)))
    b = engine.submit(Request([3, 4], greedy(10)))
    c = engine.submit(Request([5, 6], greedy(4)))
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    freed = next(r.step for r in reports if a.request_id in r.finished)
    admitted = next(r.step for r in reports if c.request_id in r.admitted)
    first_token = next(r.step for r in reports if c.request_id in r.sampled)
    assert admitted == freed + 1
    assert first_token == freed + 1  # short prompt: prefilled and sampled in the same step
    # b never skipped a step while c came and went.
    b_steps = [r.step for r in reports if b.request_id in r.sampled]
    assert b_steps == list(range(b_steps[0], b_steps[0] + 10))
    assert [h.result().finish_reason for h in (a, b, c)] == ["length"] * 3


def test_long_prompt_prefill_is_interleaved_with_running_decodes() -> None:
    runner = HashRunner(slots=2, max_ctx=512)
    engine = manual_engine(runner, prefill_chunk=16)
    short = engine.submit(Request([1, 2, 3], greedy(30)))
    engine.step()  # short is prefilled and has its first token
    long_prompt = [int(x) for x in np.arange(200) % 250 + 1]
    long = engine.submit(Request(long_prompt, greedy(3)))
    reports = []
    while not long.done and engine.has_work():
        reports.append(engine.step())
        long.poll()
    first_long = next(r for r in reports if long.request_id in r.sampled)
    during = [r for r in reports if r.step <= first_long.step]
    assert len(during) == 200 // 16 + 1  # ceil(200 / 16) steps of prefill
    for r in during:
        assert short.request_id in r.decoded  # the running stream never froze
        assert r.prefilled.get(long.request_id, 0) <= 16
    assert sum(r.prefilled[long.request_id] for r in during) == 200
    # Decode and prefill chunk went through the same forward call.
    mixed = [b for b in runner.batches if len(b) == 2 and {len(w.tokens) for w in b} == {1, 16}]
    assert len(mixed) >= 200 // 16
    run_to_end(engine)
    assert list(long.result().token_ids) == reference_greedy(long_prompt, 3, max_ctx=512)
    assert list(short.result().token_ids) == reference_greedy([1, 2, 3], 30, max_ctx=512)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch() -> None:
    params = SamplingParams(max_tokens=15, temperature=1.0, top_p=0.9, seed=1234)
    alone = manual_engine().generate(Request([4, 5, 6], params))
    engine = manual_engine(prefill_chunk=4)
    others = [
        engine.submit(Request([9] * 11, SamplingParams(max_tokens=20, temperature=1.3)))
        for _ in range(2)
    ]
    mine = engine.submit(Request([4, 5, 6], params))
    run_to_end(engine)
    assert mine.result().token_ids == alone.token_ids
    assert all(o.result().finish_reason == "length" for o in others)
    other_seed = manual_engine().generate(Request([4, 5, 6], params.model_copy(update={"seed": 9})))
    assert other_seed.token_ids != alone.token_ids


def test_abort_waiting_and_running_requests_frees_the_slot_at_the_next_step() -> None:
    engine = manual_engine(HashRunner(slots=1))
    running = engine.submit(Request([1, 2], greedy(50)))
    queued = engine.submit(Request([3], greedy(50)))
    third = engine.submit(Request([4], greedy(2)))
    engine.step()
    assert engine.abort(queued.request_id)
    engine.step()
    assert [e.finish_reason for e in queued.poll()] == ["abort"]
    assert engine.abort(running.request_id)
    report = engine.step()
    assert report.finished == {running.request_id: "abort"}
    assert report.admitted == [third.request_id]  # slot refilled in the same step
    assert third.request_id in report.sampled
    run_to_end(engine)
    assert running.result().finish_reason == "abort"
    assert third.result().token_ids == tuple(reference_greedy([4], 2))
    assert not engine.abort(running.request_id)  # already finished
    assert not engine.abort("no-such-request")


def test_full_queue_rejects_and_others_are_unaffected() -> None:
    # One slot + two queue places: three requests fit before any step.
    engine = manual_engine(HashRunner(slots=1), max_queue=2)
    handles = [engine.submit(Request([i + 1], greedy(4))) for i in range(3)]
    # Before any step the first request is still in `waiting`, bound for the free slot: it
    # takes no queue place, so the message counts two waiting, not three.
    before_step = "0 of 1 slots taken and 2 requests waiting for one (queue limit 2)"
    with pytest.raises(QueueFullError, match=re.escape(f"engine is busy: {before_step}")):
        engine.submit(Request([9], greedy(4)))
    with pytest.raises(QueueFullError, match="2 requests asked at once"):  # all or none
        engine.submit_all([Request([9], greedy(4)), Request([8], greedy(4))])
    assert engine.metrics().queue_depth == 3
    engine.step()  # first admitted into the slot: still three in the engine, still full
    after_step = "1 of 1 slots taken and 2 requests waiting for one (queue limit 2)"
    with pytest.raises(QueueFullError, match=re.escape(after_step)):
        engine.submit(Request([9], greedy(4)))
    while engine.metrics().slots_busy:  # the first finishes: one place frees up
        engine.step()
    handles.append(engine.submit(Request([9], greedy(4))))
    run_to_end(engine)
    for h, p in zip(handles, ([1], [2], [3], [9]), strict=True):
        assert list(h.result().token_ids) == reference_greedy(p, 4)


def test_bad_requests_fail_before_any_compute() -> None:
    runner = HashRunner(slots=1, max_ctx=16)
    engine = manual_engine(runner)
    with pytest.raises(ContextOverflowError) as info:
        engine.submit(Request(list(range(1, 17)), greedy(4)))
    assert "17" in str(info.value) and "16" in str(info.value)
    with pytest.raises(InvalidParameterError, match="no tokens"):
        engine.submit(Request([], greedy(4)))
    with pytest.raises(InvalidParameterError, match="vocabulary"):
        engine.submit(Request([1, 256], greedy(4)))
    with pytest.raises(InvalidParameterError, match="stop_token_ids: token id 999"):
        engine.submit(Request([1], greedy(4, stop_token_ids=(999,))))
    with pytest.raises(ValidationError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValidationError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValidationError):
        SamplingParams(stop=["ok", ""])
    assert runner.batches == [] and not engine.has_work()
    # A 15-token prompt fits (15 + 1 <= 16) and generation stops at the context end.
    res = engine.generate(Request(list(range(1, 16)), greedy(100)))
    assert res.finish_reason == "length"
    assert len(res.token_ids) == 2  # one from the 15-token prefill, one from the 16th cell
    assert res.token_ids == tuple(reference_greedy(list(range(1, 16)), 2, max_ctx=16))


def test_a_failing_request_errors_alone_and_the_engine_keeps_serving() -> None:
    reference = reference_greedy([5, 6, 7], 8)
    poison = reference[3]  # the poisoned request feeds this token at its 4th decode
    runner = HashRunner(slots=3, fail_on_token=poison)
    engine = manual_engine(runner)
    bad = engine.submit(Request([5, 6, 7], greedy(8)))
    good = [engine.submit(Request(p, greedy(n))) for p, n in (([20, 21], 12), ([30], 6))]
    run_to_end(engine)
    res = bad.result()
    assert res.finish_reason == "error" and "poisoned" in (res.error or "")
    assert list(res.token_ids) == reference[:4]
    for h, (p, n) in zip(good, (([20, 21], 12), ([30], 6)), strict=True):
        assert poison not in reference_greedy(p, n)[:-1]  # the healthy ones never feed it
        assert list(h.result().token_ids) == reference_greedy(p, n)
    after = engine.generate(Request([40, 41], greedy(5)))
    assert after.finish_reason == "length"
    assert engine.metrics().finish_reasons == {"error": 1, "length": 3}


def test_eos_and_stop_token_ids_finish_with_stop_and_hide_their_text() -> None:
    text = "hi there"
    script = [*text.encode(), 0]  # 0 is eos for the ByteTokenizer
    engine = Engine(ScriptRunner(script, end=0, slots=1), ByteTokenizer(), background=False)
    res = engine.generate(Request([1, 2], greedy(50)))
    assert (res.text, res.finish_reason) == ("hi there", "stop")
    assert res.token_ids[-1] == 0
    ignored = engine.generate(Request([1, 2], greedy(12, ignore_eos=True)))
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 12
    by_id = engine.generate(Request([1, 2], greedy(50, stop_token_ids=(ord(" "),))))
    assert (by_id.text, by_id.finish_reason) == ("hi", "stop")


def test_stop_string_split_over_tokens_is_never_shown() -> None:
    script = list(b"The answer: 42\nEND more")
    engine = Engine(ScriptRunner(script, end=0, slots=1), ByteTokenizer(), background=False)
    handle = engine.submit(Request([1], greedy(50, stop=("\nEND", "zzz"))))
    events = list(handle)
    assert "".join(e.text for e in events) == "The answer: 42"
    assert all("\n" not in e.text for e in events)  # the held "\n" never leaked
    assert events[-1].finish_reason == "stop"
    # The stop string's tokens were generated (and counted), their text was not shown.
    assert events[-1].metrics is not None
    assert events[-1].metrics.completion_tokens == len("The answer: 42\nEND")


def test_emoji_split_over_byte_tokens_streams_whole_characters() -> None:
    text = "ok 🙂 中文!"
    engine = Engine(
        ScriptRunner(list(text.encode()), end=0, slots=1), ByteTokenizer(), background=False
    )
    events = list(engine.submit(Request([1], greedy(50))))
    assert "".join(e.text for e in events) == text
    assert all("\ufffd" not in e.text for e in events)
    assert sum(1 for e in events if e.text == "") >= 3 + 2 * 2  # bytes held until complete


def test_logprobs_are_reported_per_token() -> None:
    engine = manual_engine()
    res = engine.generate(Request([1, 2, 3], greedy(4, logprobs=3)))
    assert len(res.logprobs) == 4
    for lp, tok in zip(res.logprobs, res.token_ids, strict=True):
        assert lp.token_id == tok and lp.logprob <= 0.0
        assert len(lp.top) == 3 and lp.top[0][0] == tok  # greedy: the chosen token is the best
        assert lp.top[0][2] >= lp.top[1][2] >= lp.top[2][2]


def test_metrics_from_a_driven_clock() -> None:
    now = [0.0]
    engine = Engine(HashRunner(slots=2), ByteTokenizer(), background=False, clock=lambda: now[0])
    a = engine.submit(Request([1, 2, 3], greedy(5)))
    engine.submit(Request([4, 5], greedy(3)))
    c = engine.submit(Request([6], greedy(2)))
    m = engine.metrics()
    assert (m.slots_busy, m.queue_depth, m.kv_cells_used) == (0, 3, 0)
    now[0] = 1.0
    engine.step()  # a, b admitted at t=1 and get their first token at t=1
    m = engine.metrics()
    assert (m.slots_busy, m.queue_depth, m.kv_cells_used, m.kv_cells_total) == (2, 1, 5, 512)
    while engine.has_work():
        now[0] += 0.5
        engine.step()
    ma = a.result().metrics
    assert ma is not None
    assert (ma.prompt_tokens, ma.completion_tokens) == (3, 5)
    assert ma.queued_s == 1.0 and ma.ttft_s == 1.0
    assert ma.tpot_s == pytest.approx(0.5) and ma.decode_tps == pytest.approx(2.0)
    mc = c.result().metrics
    # b finished at t=2.0 (its third step); c took the slot at the next step.
    assert mc is not None and mc.queued_s == pytest.approx(2.5)
    m = engine.metrics()
    assert m.requests_finished == 3 and m.finish_reasons == {"length": 3}
    assert (m.prompt_tokens_total, m.completion_tokens_total) == (6, 10)
    assert m.slots_busy == 0 and m.kv_cells_used == 0 and m.steps > 0
    assert m.ttft_p50_s == pytest.approx(1.0)
    assert m.tpot_p50_s == pytest.approx(0.5) and m.tpot_p99_s == pytest.approx(0.5)


def test_prefix_reuse_hook_gives_cold_results_and_counts_cached_tokens() -> None:
    runner = HashRunner(slots=2)
    engine = manual_engine(runner, prefix_reuse=True)
    first = engine.generate(Request([1, 2, 3, 4, 5], greedy(6)))
    other = engine.generate(Request([9, 9], greedy(3)))  # keeps the other slot warm
    follow = [1, 2, 3, 4, 5, *first.token_ids, 7, 8]  # a second turn of the same chat
    second = engine.generate(Request(follow, greedy(6)))
    assert list(second.token_ids) == reference_greedy(follow, 6)
    assert second.metrics is not None
    # Prompt + all but the last answer token were in the slot's cache.
    assert second.metrics.cached_tokens == 5 + 6 - 1
    assert engine.metrics().cached_prompt_tokens_total == 10
    assert list(other.token_ids) == reference_greedy([9, 9], 3)
    # A prompt that is a strict prefix of a cache still feeds its last token (its logits).
    again = engine.generate(Request([1, 2, 3], greedy(4)))
    assert list(again.token_ids) == reference_greedy([1, 2, 3], 4)
    assert again.metrics is not None and again.metrics.cached_tokens == 2


def test_scripted_arrivals_are_admitted_as_slots_free() -> None:
    # step -> requests arriving just before that step; 2 slots, budget 8 prompt tokens per step.
    arrivals = {
        0: [("a", [1, 2, 3], 4), ("b", [4, 5], 9)],
        2: [("c", [6, 7, 8], 5)],  # both slots busy: waits for a
        3: [("d", list(range(20, 45)), 3)],  # long prompt, waits for the next free slot
        9: [("e", [9], 2)],
    }
    engine = manual_engine(HashRunner(slots=2), prefill_chunk=8)
    handles, reports = {}, []
    step = 0
    while step in arrivals or engine.has_work() or step < max(arrivals):
        for rid, prompt, n in arrivals.get(step, []):
            handles[rid] = (engine.submit(Request(prompt, greedy(n), request_id=rid)), prompt, n)
        reports.append(engine.step())
        step += 1

    def first(key: str, rid: str) -> int:
        return next(r.step for r in reports if rid in getattr(r, key))

    # a (4 tokens) finishes at step 3, so c, waiting since step 2, is admitted and answers at 4.
    assert [r.step for r in reports if "a" in r.finished] == [3]
    assert first("admitted", "c") == first("sampled", "c") == 4
    # b and c both finish at step 8; d (waiting since 3) and e (arrived 9) take the slots at 9.
    assert first("admitted", "d") == first("admitted", "e") == 9
    # d's 25-token prompt is fed 8 + 8 + 8 + 1; e's one token rides in the leftover budget of
    # the last chunk (prefill budget goes first come, first served).
    assert [r.prefilled.get("d") for r in reports[9:13]] == [8, 8, 8, 1]
    assert first("sampled", "d") == first("sampled", "e") == 12
    for rid, (h, prompt, n) in handles.items():
        assert list(h.result().token_ids) == reference_greedy(prompt, n), rid


def test_random_schedule_with_aborts_keeps_every_answer_exact() -> None:
    rng = np.random.default_rng(7)
    engine = manual_engine(HashRunner(slots=3, max_ctx=96), prefill_chunk=7, max_queue=100)
    live: dict[str, tuple] = {}
    aborted: set[str] = set()
    for step in range(160):
        if step < 120 and rng.random() < 0.3:
            prompt = [int(x) for x in rng.integers(1, 256, size=int(rng.integers(1, 30)))]
            n = int(rng.integers(1, 12))
            h = engine.submit(Request(prompt, greedy(n)))
            live[h.request_id] = (h, prompt, n)
        if live and rng.random() < 0.08:
            rid = str(rng.choice(sorted(live)))
            if engine.abort(rid):
                aborted.add(rid)
        engine.step()
    run_to_end(engine)
    assert len(live) > 25 and aborted
    for rid, (h, prompt, n) in live.items():
        res = h.result()
        ref = reference_greedy(prompt, n, max_ctx=96)
        if res.finish_reason == "abort":
            assert rid in aborted and list(res.token_ids) == ref[: len(res.token_ids)]
        else:
            assert list(res.token_ids) == ref, rid
    m = engine.metrics()
    assert m.slots_busy == 0 and m.queue_depth == 0 and m.kv_cells_used == 0
    assert m.requests_finished == len(live)
