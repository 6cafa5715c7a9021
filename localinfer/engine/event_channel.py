"""Events from the engine thread to the asyncio streams of one event loop, one wake-up per batch.

``Engine.stream`` hands each event to the event loop that reads it. Waking the loop once per event
(``call_soon_threadsafe`` then ``asyncio.Queue.put_nowait``) costs the loop's thread a wake-up,
the queue's getter bookkeeping and a GIL hand-over for every token of every stream; and a step that
emits a token for each of eight slots wakes the loop up to eight times while the engine thread is
still emitting, each time passing the GIL back and forth. Here the engine thread posts events to
the loop's :class:`LoopMailbox`; only the post that finds the mailbox empty wakes the loop, so the
events of one step (posted together, before the loop can take the GIL) arrive in one callback,
which hands each to its stream's :class:`EventChannel`.

Order holds: one mailbox per loop keeps posting order, and a channel is read by one consumer.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque

from localinfer.engine.types import StreamEvent


class EventChannel:
    """One stream's events on its event loop: pushed by the loop's mailbox, awaited by one
    reader. Loop thread only."""

    __slots__ = ("_items", "_loop", "_waiter", "_mailbox")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._mailbox = LoopMailbox.of(loop)

    def post(self, event: StreamEvent) -> None:
        """Any thread: ``event`` reaches this channel through the loop's mailbox."""
        self._mailbox.post(self, event)

    def push(self, event: StreamEvent) -> None:
        """Loop thread: ``event`` is ready to read."""
        self._items.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> StreamEvent:
        """The next event, waiting for it if none is ready."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class LoopMailbox:
    """Events posted from any thread for one event loop's channels (module doc)."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = (
        weakref.WeakKeyDictionary()
    )
    _by_loop_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the registry's value must not keep its key (the loop) alive.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._posted: list[tuple[EventChannel, StreamEvent]] = []

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopMailbox:
        """The mailbox of ``loop`` (made on first use; it goes with the loop)."""
        with cls._by_loop_lock:
            mailbox = cls._by_loop.get(loop)
            if mailbox is None:
                mailbox = cls._by_loop[loop] = cls(loop)
            return mailbox

    def post(self, channel: EventChannel, event: StreamEvent) -> None:
        """Queue ``event`` for ``channel``; wake the loop unless a wake-up is already due.
        Raises RuntimeError when the loop is closed (as ``call_soon_threadsafe`` does)."""
        with self._lock:
            wake = not self._posted
            self._posted.append((channel, event))
        if wake:
            try:
                loop = self._loop()
                if loop is None:  # a live channel holds its loop: only a stray post gets here
                    raise RuntimeError("the event loop of this stream is gone")
                loop.call_soon_threadsafe(self._deliver)
            except BaseException:
                with self._lock:  # nothing will deliver them: a later post must wake again
                    self._posted.clear()
                raise

    def _deliver(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
        for channel, event in posted:
            channel.push(event)
