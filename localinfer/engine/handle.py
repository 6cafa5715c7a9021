"""What a caller holds for one submitted request: a stream of events and the final result."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from localinfer.engine.types import FinishReason, RequestMetrics, StreamEvent, TokenLogprob


@dataclass(slots=True, frozen=True)
class GenerationResult:
    """A whole answer, assembled from a request's events."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    error: str | None
    logprobs: tuple[TokenLogprob, ...]
    metrics: RequestMetrics | None
    stop_sequence: str | None = None  # the stop string that ended it, when one did
    reasoning: str = ""  # a thinking request's reasoning, apart from ``text``

    @classmethod
    def from_events(cls, events: Iterable[StreamEvent]) -> GenerationResult:
        text: list[str] = []
        reasoning: list[str] = []
        ids: list[int] = []
        lps: list[TokenLogprob] = []
        last: StreamEvent | None = None
        for ev in events:
            text.append(ev.text)
            reasoning.append(ev.reasoning)
            ids.extend(ev.token_ids)
            lps.extend(ev.logprobs)
            last = ev
        if last is None or last.finish_reason is None:
            raise RuntimeError("event stream ended without a finish reason")
        return cls(
            request_id=last.request_id,
            text="".join(text),
            token_ids=tuple(ids),
            finish_reason=last.finish_reason,
            error=last.error,
            logprobs=tuple(lps),
            metrics=last.metrics,
            stop_sequence=last.stop_sequence,
            reasoning="".join(reasoning),
        )


class RequestHandle:
    """Iterate to receive a request's StreamEvents (blocking); the last has a finish_reason.

    Events are queued by the engine thread as they happen, so a slow reader never slows other
    requests. In the engine's manual mode (no thread) iterating drives ``Engine.step`` itself.
    """

    def __init__(
        self,
        request_id: str,
        *,
        abort: Callable[[str], bool],
        pump: Callable[[], object] | None = None,
    ) -> None:
        self.request_id = request_id
        self._queue: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
        self._abort = abort
        self._pump = pump
        self._done = False
        self._events: list[StreamEvent] = []  # everything handed out, for result()

    def put(self, event: StreamEvent) -> None:
        """Called by the engine thread."""
        self._queue.put(event)

    @property
    def done(self) -> bool:
        return self._done

    def poll(self) -> list[StreamEvent]:
        """Events that have arrived, without waiting."""
        out: list[StreamEvent] = []
        while True:
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                return out
            out.append(ev)
            self._events.append(ev)
            if ev.finish_reason is not None:
                self._done = True
                return out

    def __iter__(self) -> Iterator[StreamEvent]:
        while not self._done:
            ev = self._next()
            self._events.append(ev)
            if ev.finish_reason is not None:
                self._done = True
            yield ev

    def _next(self) -> StreamEvent:
        if self._pump is None:
            return self._queue.get()
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                self._pump()

    def result(self) -> GenerationResult:
        """Wait for the end and return the whole answer (including events already read)."""
        for _ in self:
            pass
        return GenerationResult.from_events(self._events)

    def abort(self) -> bool:
        return self._abort(self.request_id)
