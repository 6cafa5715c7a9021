"""The engine with its background thread: synchronous handles from many threads, asyncio streams,
client disconnects and shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from localinfer.engine import Engine, Request, SamplingParams
from localinfer.errors import QueueFullError
from tests.engine_gate import EngineGate
from tests.test_engine import reference_greedy
from tests.test_engine_model import ByteTokenizer, HashRunner


@pytest.fixture
def engine():
    eng = Engine(HashRunner(slots=3), ByteTokenizer(), prefill_chunk=8)
    yield eng
    eng.close()


def test_concurrent_submitters_each_get_their_solo_answer(engine: Engine) -> None:
    prompts = [[i + 1, i + 2, 2 * i + 3] * (i + 1) for i in range(7)]
    results: dict[int, tuple[int, ...]] = {}

    def client(i: int) -> None:
        results[i] = engine.generate(Request(prompts[i], SamplingParams(max_tokens=10))).token_ids

    threads = [threading.Thread(target=client, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i, p in enumerate(prompts):
        assert list(results[i]) == reference_greedy(p, 10)
    m = engine.metrics()
    assert m.requests_finished == 7 and m.slots_busy == 0 and m.queue_depth == 0


def test_streaming_handle_yields_tokens_as_they_come(engine: Engine) -> None:
    events = list(engine.submit(Request([1, 2, 3], SamplingParams(max_tokens=6))))
    assert [len(e.token_ids) for e in events] == [1] * 6
    assert [e.finish_reason for e in events] == [None] * 5 + ["length"]
    assert events[-1].metrics is not None and events[-1].metrics.ttft_s is not None
    # Live metrics ride on every event: the count grows one token at a time.
    assert [e.metrics.completion_tokens for e in events if e.metrics] == [1, 2, 3, 4, 5, 6]


async def test_async_stream_matches_the_sync_result(engine: Engine) -> None:
    async def one(prompt: list[int]) -> list[int]:
        ids: list[int] = []
        async for event in engine.stream(Request(prompt, SamplingParams(max_tokens=8))):
            ids.extend(event.token_ids)
        return ids

    got = await asyncio.gather(*(one([k, k + 1]) for k in range(1, 6)))
    assert got == [reference_greedy([k, k + 1], 8) for k in range(1, 6)]


async def test_async_stream_validates_before_iteration(engine: Engine) -> None:
    from localinfer.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError, match="plus one new token"):
        engine.stream(Request([7] * 300, SamplingParams(max_tokens=4)))
    assert engine.metrics().queue_depth == 0


async def test_leaving_an_async_stream_early_aborts_the_request() -> None:
    engine = Engine(HashRunner(slots=3), ByteTokenizer(), prefill_chunk=8)
    # Held after four forwards: the test, not the machine's speed, decides how far the request
    # got when its client left.
    gate = EngineGate(engine, free=4)
    try:
        request = Request([5, 6], SamplingParams(max_tokens=200), request_id="leaver")
        seen = 0
        async for _event in engine.stream(request):
            seen += 1
            if seen == 3:
                break
        gate.open()  # the engine may run again; the abort lands at its next step
        for _ in range(200):
            if engine.metrics().finish_reasons.get("abort"):
                break
            await asyncio.sleep(0.01)
        m = engine.metrics()
        assert m.finish_reasons == {"abort": 1} and m.slots_busy == 0
        # The id is free again and the engine still serves.
        again = await asyncio.to_thread(
            engine.generate, Request([5, 6], SamplingParams(max_tokens=4), request_id="leaver")
        )
        assert list(again.token_ids) == reference_greedy([5, 6], 4)
    finally:
        engine.close()


def test_close_aborts_what_is_in_flight_and_refuses_new_work() -> None:
    engine = Engine(HashRunner(slots=1), ByteTokenizer(), background=False)
    running = engine.submit(Request([1], SamplingParams(max_tokens=100)))
    queued = engine.submit(Request([2], SamplingParams(max_tokens=100)))
    engine.step()
    engine.close()
    assert running.result().finish_reason == "abort"
    assert queued.result().error == "engine closed"
    with pytest.raises(QueueFullError):
        engine.submit(Request([3]))
