"""Wake the coroutines waiting for shared state to change, from whichever thread changed it.

The model pool's state moves in load, unload and keep-alive threads and in request handlers,
while its waiters are coroutines on the server's event loop: a ``threading.Condition`` would
block the loop, so each waiter parks on an ``asyncio.Event`` that ``notify`` sets through its
loop's ``call_soon_threadsafe``. A version number closes the gap between a waiter's look at the
state and its parking: a change in between is seen at once, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class StateSignal:
    """``notify`` after every change; waiters read ``version`` where they read the state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._waiters: dict[asyncio.Event, asyncio.AbstractEventLoop] = {}

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def waiting(self) -> int:
        """How many coroutines are parked now."""
        with self._lock:
            return len(self._waiters)

    def notify(self) -> None:
        """The state changed: wake every waiter (safe from any thread, and on the loop)."""
        with self._lock:
            self._version += 1
            waiters = list(self._waiters.items())
        for event, loop in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits there now
                loop.call_soon_threadsafe(event.set)

    async def wait(self, seen: int, timeout: float) -> bool:
        """Park until the version moves past ``seen`` (True) or ``timeout`` seconds pass
        (False)."""
        event = asyncio.Event()
        with self._lock:
            if self._version != seen:
                return True
            self._waiters[event] = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.pop(event, None)
