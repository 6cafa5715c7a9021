"""The engine-thread-to-event-loop hand-off (engine/event_channel.py): order, one wake-up per
batch of posts, a closed loop, a cancelled reader; and the engine's streams through it."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from localinfer.engine.event_channel import EventChannel, LoopMailbox
from localinfer.engine.types import StreamEvent


def event(i: int, last: bool = False) -> StreamEvent:
    return StreamEvent("r", str(i), (i,), finish_reason="stop" if last else None)


class CountingLoop:
    """Wraps a loop's call_soon_threadsafe to count the wake-ups the mailbox asks for."""

    def __init__(self, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = loop.call_soon_threadsafe

        def counted(*args: object) -> object:
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(loop, "call_soon_threadsafe", counted)


def test_events_posted_from_another_thread_arrive_in_order_on_each_channel() -> None:
    async def main() -> tuple[list[str], list[str]]:
        loop = asyncio.get_running_loop()
        a, b = EventChannel(loop), EventChannel(loop)

        def engine() -> None:
            for i in range(200):
                a.post(event(i, last=i == 199))
                b.post(event(1000 + i, last=i == 199))

        thread = threading.Thread(target=engine)
        thread.start()
        got_a = [(await a.get()).text for _ in range(200)]
        got_b = [(await b.get()).text for _ in range(200)]
        thread.join()
        return got_a, got_b

    got_a, got_b = asyncio.run(main())
    assert got_a == [str(i) for i in range(200)]
    assert got_b == [str(1000 + i) for i in range(200)]


def test_a_batch_posted_before_the_loop_runs_wakes_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> tuple[int, int, list[str]]:
        loop = asyncio.get_running_loop()
        counter = CountingLoop(loop, monkeypatch)
        channels = [EventChannel(loop) for _ in range(8)]
        for i, channel in enumerate(channels):  # one step's tokens, one per slot
            channel.post(event(i))
        first = counter.calls
        texts = [(await c.get()).text for c in channels]
        channels[0].post(event(8))  # the next step: the mailbox is empty again
        texts.append((await channels[0].get()).text)
        return first, counter.calls, texts

    first, total, texts = asyncio.run(main())
    assert first == 1
    assert total == 2
    assert texts == [str(i) for i in range(9)]


def test_a_closed_loop_refuses_the_post_and_a_later_loop_is_unaffected() -> None:
    loop = asyncio.new_event_loop()
    channel = EventChannel(loop)
    loop.close()
    with pytest.raises(RuntimeError):
        channel.post(event(0))
    with pytest.raises(RuntimeError):  # the failed post left nothing that blocks a new wake-up
        channel.post(event(1))

    async def fresh() -> str:
        other = EventChannel(asyncio.get_running_loop())
        other.post(event(2))
        return (await other.get()).text

    assert asyncio.run(fresh()) == "2"


def test_a_reader_cancelled_while_waiting_leaves_the_channel_usable() -> None:
    async def main() -> str:
        channel = EventChannel(asyncio.get_running_loop())
        waiting = asyncio.ensure_future(channel.get())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        channel.post(event(5))
        return (await channel.get()).text

    assert asyncio.run(main()) == "5"


def test_each_loop_has_its_own_mailbox() -> None:
    one, two = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert LoopMailbox.of(one) is LoopMailbox.of(one)
        assert LoopMailbox.of(one) is not LoopMailbox.of(two)
    finally:
        one.close()
        two.close()


def test_the_registry_does_not_keep_a_dropped_loop_alive() -> None:
    loop = asyncio.new_event_loop()
    mailbox = LoopMailbox.of(loop)
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None
    with pytest.raises(RuntimeError, match="gone"):
        mailbox.post(EventChannel.__new__(EventChannel), event(0))
