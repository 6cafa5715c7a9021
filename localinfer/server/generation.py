"""One completion through the engine, answered as OpenAI JSON or as an SSE stream.

The routes parse, template and tokenize; this submits the engine ``Request``, waits for the
engine to admit it (or refuse it) before the status line goes out, and renders what comes back.
A client that leaves frees its slot at once (see ``streaming``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from localinfer.engine import ConstraintSource
from localinfer.engine.types import Request as EngineRequest
from localinfer.engine.types import StreamEvent
from localinfer.errors import LocalinferError
from localinfer.server.answer_shape import PlainAnswer, ShapeFactory
from localinfer.server.errors import APIError, from_localinfer_error
from localinfer.server.responses import Kind, ResponseBuilder
from localinfer.server.schemas import SamplingFields
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.streaming import (
    SSE_DONE,
    ClientGone,
    EventStreamResponse,
    collect,
    events_after,
    sse,
    unless_disconnected,
)
from localinfer.server.translate import sampling_params
from localinfer.tools import ContentDelta

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's status for "client closed request"; only ever logged


@dataclass(slots=True, frozen=True)
class GenerationInput:
    """What a route hands over: the parsed body and the prompt it tokenized."""

    kind: Kind
    body: SamplingFields
    prompt_ids: list[int]
    logprobs: int | None  # top alternatives per token, None: no logprobs
    max_tokens: int | None
    echo: str = ""  # text completions with echo: the prompt text, sent before the answer
    constraint: ConstraintSource | None = None  # JSON mode, a schema or a forced tool call
    shape: ShapeFactory = PlainAnswer  # how the answer's text becomes content or tool calls


async def generate(
    state: ServerState, session: ServedSession, request: Request, given: GenerationInput
) -> Response:
    """Run ``given`` on the session's engine and answer the HTTP ``request``."""
    return await _Exchange(state, session, given).respond(request)


class _Exchange:
    """One request in flight: its engine events and how its response is built."""

    def __init__(self, state: ServerState, session: ServedSession, given: GenerationInput) -> None:
        self.state = state
        self.engine = session.engine
        self.given = given
        body = given.body
        params = sampling_params(
            body,
            prompt_tokens=len(given.prompt_ids),
            max_ctx=self.engine.max_ctx,
            logprobs=given.logprobs,
            max_tokens=given.max_tokens,
        )
        self.builder = ResponseBuilder(
            given.kind,
            model=state.served_name,
            token_bytes=session.model.tokenizer.token_bytes,
            want_logprobs=given.logprobs is not None,
            include_usage=bool(
                body.stream and body.stream_options and body.stream_options.include_usage
            ),
        )
        self.rid = self.builder.id
        self.shape = given.shape()
        self.events = self.engine.stream(
            EngineRequest(
                given.prompt_ids, params, request_id=self.rid, constraint=given.constraint
            )
        )

    async def respond(self, request: Request) -> Response:
        # The engine admits (or refuses: queue full, context overflow) on the first step of the
        # stream, so the status line waits for that: errors still get their proper HTTP status.
        try:
            first = await unless_disconnected(self._first_event(), request.receive)
        except ClientGone:
            await self.events.aclose()
            return self._client_gone()
        except LocalinferError as exc:
            await self.events.aclose()
            raise from_localinfer_error(exc) from None
        if not self.given.body.stream:
            return await self._whole_answer(first, request)
        return EventStreamResponse(self._sse_chunks(first), self._on_stream_closed)

    async def _first_event(self) -> StreamEvent:
        return await anext(self.events)

    def _client_gone(self) -> Response:
        self.engine.abort(self.rid)
        self.state.metrics.count_disconnect()
        log.info("%s: client disconnected; request aborted", self.rid)
        return Response(status_code=CLIENT_CLOSED)

    async def _whole_answer(self, first: StreamEvent, request: Request) -> Response:
        try:
            done = await unless_disconnected(collect(first, self.events), request.receive)
        except ClientGone:
            return self._client_gone()
        finally:
            await self.events.aclose()
        if done.finish_reason in ("error", "abort"):
            raise failed(done.finish_reason, done.error)
        self.state.metrics.observe_request(done.metrics)
        deltas = self.shape.feed(done.text)
        tail, reason = self.shape.finish(done.finish_reason)
        content = "".join(d.text for d in [*deltas, *tail] if isinstance(d, ContentDelta))
        return JSONResponse(
            self.builder.response(
                content,
                reason,
                done.logprobs,
                done.metrics,
                len(self.given.prompt_ids),
                done.token_count,
                echo_prefix=self.given.echo,
                tool_calls=self.shape.calls,
            )
        )

    async def _sse_chunks(self, first: StreamEvent) -> AsyncIterator[bytes]:
        builder = self.builder
        try:
            head = builder.first_chunk(self.given.echo)
            if head is not None:
                yield sse(head)
            count = 0
            async for ev in events_after(first, self.events):
                count += len(ev.token_ids)
                for chunk in builder.delta_chunks(self.shape.feed(ev.text), ev.logprobs):
                    yield sse(chunk)
                if ev.finish_reason is None:
                    continue
                if ev.finish_reason in ("error", "abort"):
                    yield sse(failed(ev.finish_reason, ev.error).body())
                    break
                tail, reason = self.shape.finish(ev.finish_reason)
                for chunk in builder.delta_chunks(tail, ()):
                    yield sse(chunk)
                self.state.metrics.observe_request(ev.metrics)
                yield sse(builder.finish_chunk(reason, ev.metrics))
                if builder.include_usage:
                    prompt_tokens = len(self.given.prompt_ids)
                    yield sse(builder.usage_chunk(ev.metrics, prompt_tokens, count))
            yield SSE_DONE
        finally:
            await self.events.aclose()

    def _on_stream_closed(self) -> None:
        if self.engine.abort(self.rid):  # False when the answer finished: nothing to free
            self.state.metrics.count_disconnect()
            log.info("%s: client disconnected mid-stream; request aborted", self.rid)


def failed(finish_reason: str, error: str | None) -> APIError:
    """The error of an answer the engine ended with ``error`` or ``abort``."""
    if finish_reason == "abort":
        return APIError(
            503, error or "the request was aborted (server shutting down)", code="aborted"
        )
    return APIError(500, error or "the engine failed on this request", code="engine_error")
