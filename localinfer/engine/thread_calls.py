"""Calls from other threads that must run where the runner's owner runs: the engine thread,
between two steps (a chat persisting a conversation's KV, a server flushing the KV tiers)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class EngineCalls:
    """A queue of calls for the engine thread. ``put`` from any thread under the engine's wake
    lock; ``run_all`` on the engine thread. The caller waits on the returned future."""

    def __init__(self) -> None:
        self._calls: deque[tuple[Callable[[], object], Future[object]]] = deque()

    def __bool__(self) -> bool:
        return bool(self._calls)

    def put(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[object] = Future()
        self._calls.append((fn, future))
        return future  # type: ignore[return-value]

    def run_all(self) -> None:
        """Run every queued call, handing each result or exception to its caller."""
        while self._calls:
            fn, future = self._calls.popleft()
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                future.set_exception(exc)
