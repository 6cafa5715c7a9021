"""Requests a server is still reading, so an idle engine can take a burst of them in one step.

Clients that finish together come back together: eight answers of the same length end in the same
step, and the next eight requests reach the server within a few milliseconds. The server reads
them one by one on its event loop (parse, template, tokenize) while the engine thread, woken by
the first, would start that request's prefill alone; the seven others then wait the whole forward
before theirs begins (their first token twice as late). llama-server reads all its queued tasks
at the top of each loop. Here the server counts each request from the moment its head has arrived
until it is handed to an engine or answered otherwise (:class:`Arrivals`), and an engine starting
from idle waits for that count to reach zero, at most ``GATHER_WAIT_S``
(:func:`gather_arrivals`). A lone request is handed over with the count at zero and waits for
nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

ARRIVAL = "localinfer.arrival"  # the request's Arrival in an ASGI scope's extensions
GATHER_WAIT_S = 0.010  # the most an idle engine waits for requests still being read
GATHER_POLL_S = 0.001  # how often it looks again (a request that ends without one wakes no one)


class Arrival:
    """One request being read; ``settle`` once it reaches an engine or is answered (again: a
    no-op)."""

    __slots__ = ("_arrivals", "_settled")

    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals = arrivals
        self._settled = False

    def settle(self) -> None:
        if not self._settled:
            self._settled = True
            self._arrivals._settle()


class Arrivals:
    """A count of the requests being read, shared by a server's connections and its engines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = 0

    def arrive(self) -> Arrival:
        with self._lock:
            self._pending += 1
        return Arrival(self)

    def pending(self) -> int:
        return self._pending

    def _settle(self) -> None:
        with self._lock:
            self._pending -= 1


def gather_arrivals(
    arrivals: Arrivals, wake: threading.Condition, closed: Callable[[], bool]
) -> None:
    """An engine starting from idle: wait (at most GATHER_WAIT_S) while the server is still
    reading requests, so a burst of them is admitted in one step. ``wake`` is the engine's
    condition (a submit notifies it); ``closed`` ends the wait."""
    deadline = time.monotonic() + GATHER_WAIT_S
    with wake:
        while arrivals.pending() > 0 and not closed():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            wake.wait(min(left, GATHER_POLL_S))
