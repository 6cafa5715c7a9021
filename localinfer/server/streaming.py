"""Running one request for an HTTP client: submit, race the client's disconnect, stream SSE.

A client that goes away must not keep a slot busy. Two moments matter:

* before the response starts (queued, prefilling, or a non-streaming answer being generated):
  the handler races the engine against the ASGI ``http.disconnect`` message;
* while an SSE body streams: Starlette cancels the body iterator when the client disconnects,
  and the iterator's ``finally`` aborts the request.

Either way ``Engine.abort`` runs at once and the engine frees the slot at its next step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from localinfer.engine.types import FinishReason, RequestMetrics, StreamEvent, TokenLogprob
from localinfer.server.raw_body import RAW_BODY, ChunkedBodyWriter

T = TypeVar("T")

# nginx and similar proxies buffer responses unless told not to; SSE must flow token by token.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was complete."""


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the request body is already read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> T:
    """``await work``, but raise ClientGone (cancelling ``work``) if the client leaves first.

    ``work`` has finished unwinding when this returns or raises: a cancelled ``anext`` has run
    its generator's ``finally``, so the caller may close that generator at once (closing it
    while the cancellation is still in flight raises "already running")."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # On our own cancellation (server shutdown) both go; otherwise the loser goes.
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task, watcher})
    if task.cancelled():
        raise ClientGone()
    return task.result()


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Events message."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


@dataclass(slots=True)
class Collected:
    """A whole answer gathered from a request's events."""

    text: str
    token_count: int
    finish_reason: FinishReason
    error: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    stop_sequence: str | None = None
    reasoning: str = ""


async def collect(first: StreamEvent, rest: AsyncIterator[StreamEvent]) -> Collected:
    parts, lps, count = [first.text], list(first.logprobs), len(first.token_ids)
    thought = [first.reasoning]
    last = first
    while last.finish_reason is None:
        last = await anext(rest)
        parts.append(last.text)
        thought.append(last.reasoning)
        lps.extend(last.logprobs)
        count += len(last.token_ids)
    return Collected(
        text="".join(parts),
        token_count=count,
        finish_reason=last.finish_reason,
        error=last.error,
        logprobs=lps,
        metrics=last.metrics,
        stop_sequence=last.stop_sequence,
        reasoning="".join(thought),
    )


async def events_after(
    first: StreamEvent, rest: AsyncIterator[StreamEvent]
) -> AsyncIterator[StreamEvent]:
    """The first event (already received) followed by the rest, up to the finishing one."""
    event = first
    yield event
    while event.finish_reason is None:
        event = await anext(rest)
        yield event


class EventStreamResponse(StreamingResponse):
    """An SSE response that runs ``on_close`` however it ends: completed, cut short by a client
    disconnect (Starlette cancels the body), or failed. Not left to garbage collection of the
    body generator, so the slot is freed as soon as the disconnect is seen."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(body, headers=SSE_HEADERS)
        self._on_close = on_close
        self._raw: ChunkedBodyWriter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._raw = scope.get("extensions", {}).get(RAW_BODY)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

    async def stream_response(self, send: Send) -> None:
        """Starlette's, with the body chunks between the start and the end written by the
        connection's ChunkedBodyWriter when it is ready once the start has gone out (raw_body.py:
        the bytes send would write, less the Python)."""
        raw = self._raw
        if raw is None:
            await super().stream_response(send)
            return
        direct = False

        async def send_direct(message: Message) -> None:
            nonlocal direct
            if direct and message.get("more_body"):
                await raw.write(message["body"])
                return
            await send(message)
            if message["type"] == "http.response.start":
                direct = raw.ready()

        await super().stream_response(send_direct)
