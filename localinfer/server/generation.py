"""One answer through the engine, whatever the API: whole JSON or an SSE stream.

The routes parse, template and tokenize (``answer_route``); this submits the engine ``Request``
(the engine admits or refuses it at once, before any response exists), waits for its first
event before the status line goes out, reads the answer with its shape (content or tool calls)
and writes it with the API's renderer (``answer_render``). A client that leaves frees its slot
at once (see ``streaming``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from localinfer.engine import ConstraintSource
from localinfer.engine.images import PromptImage
from localinfer.engine.reasoning import ReasoningSpec
from localinfer.engine.types import Request as EngineRequest
from localinfer.engine.types import RequestMetrics, SamplingParams, StreamEvent, TokenLogprob
from localinfer.errors import LocalinferError
from localinfer.server.answer_render import AnswerRenderer, FinishedAnswer
from localinfer.server.answer_shape import PlainAnswer, ShapeFactory
from localinfer.server.errors import APIError, from_localinfer_error
from localinfer.server.json_response import SafeJSONResponse
from localinfer.server.overflow import DROPPED_HEADER
from localinfer.server.protocol import settle_arrival
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.streaming import (
    ClientGone,
    EventStreamResponse,
    collect,
    events_after,
    unless_disconnected,
)
from localinfer.tools import ContentDelta, ReasoningDelta, StreamDelta

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's status for "client closed request"; only ever logged


@dataclass(slots=True, frozen=True)
class GenerationInput:
    """What a route hands over: the prompt it tokenized, the engine's parameters, and how the
    answer is read (``shape``) and written (``renderer``)."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    renderer: AnswerRenderer
    constraint: ConstraintSource | None = None  # JSON mode, a schema or a forced tool call
    shape: ShapeFactory = PlainAnswer  # how the answer's text becomes content or tool calls
    reasoning: ReasoningSpec | None = None  # a thinking model's reasoning, split off the answer
    images: tuple[PromptImage, ...] = ()  # the prompt's images (image_parts.py)
    dropped: int = 0  # messages left out to fit the context (serve --context-overflow)


async def generate(
    state: ServerState, session: ServedSession, request: Request, given: GenerationInput
) -> Response:
    """Run ``given`` on the session's engine and answer the HTTP ``request``."""
    submitted = EngineRequest(
        given.prompt_ids,
        given.params,
        request_id=given.renderer.id,
        constraint=given.constraint,
        reasoning=given.reasoning,
        images=given.images,
    )
    settle_arrival(request.scope)  # read: no idle engine waits for it (engine/arrivals.py)
    try:
        # ``Engine.stream`` validates and queues the request at once: a full queue (or an engine
        # shutting down), a prompt past the context or a bad parameter raises here, before any
        # response exists, so a stream gets the same status and error body as a whole answer.
        events = session.engine.stream(submitted)
    except LocalinferError as exc:
        raise from_localinfer_error(exc) from None
    return await _Exchange(state, session, given, events).respond(request)


class _Exchange:
    """One admitted request in flight: its engine events and how its response is built."""

    def __init__(
        self,
        state: ServerState,
        session: ServedSession,
        given: GenerationInput,
        events: AsyncIterator[StreamEvent],
    ) -> None:
        self.state = state
        self.engine = session.engine
        self.given = given
        self.renderer = given.renderer
        self.rid = given.renderer.id
        self.shape = given.shape()
        self.events = events

    async def respond(self, request: Request) -> Response:
        # The status line waits for the first event (the request queued, then prefilled), so a
        # client that leaves meanwhile is seen here and its place freed at once.
        try:
            first = await unless_disconnected(self._first_event(), request.receive)
        except ClientGone:
            await self.events.aclose()
            return self._client_gone()
        if not self.given.stream:
            response = await self._whole_answer(first, request)
        else:
            response = EventStreamResponse(self._sse_chunks(first), self._on_stream_closed)
        if self.given.dropped:
            response.headers[DROPPED_HEADER] = str(self.given.dropped)
        return response

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
        answer = self._answer(content, reason, done.logprobs, done.metrics, done.token_count)
        answer = dataclasses.replace(
            answer, stop_sequence=done.stop_sequence, reasoning=done.reasoning
        )
        return SafeJSONResponse(self.renderer.whole(answer))

    async def _sse_chunks(self, first: StreamEvent) -> AsyncIterator[bytes]:
        renderer = self.renderer
        try:
            for message in renderer.opening():
                yield message
            count = 0
            async for ev in events_after(first, self.events):
                count += len(ev.token_ids)
                for message in renderer.deltas(self._deltas(ev), ev.logprobs):
                    yield message
                if ev.finish_reason is None:
                    continue
                if ev.finish_reason in ("error", "abort"):
                    for message in renderer.failure(failed(ev.finish_reason, ev.error)):
                        yield message
                    return
                tail, reason = self.shape.finish(ev.finish_reason)
                for message in renderer.deltas(tail, ()):
                    yield message
                self.state.metrics.observe_request(ev.metrics)
                answer = self._answer("", reason, (), ev.metrics, count)
                answer = dataclasses.replace(answer, stop_sequence=ev.stop_sequence)
                for message in renderer.closing(answer):
                    yield message
        finally:
            await self.events.aclose()

    def _deltas(self, ev: StreamEvent) -> list[StreamDelta]:
        """An event's reasoning, then its answer read by the shape (tool calls are looked for
        in the answer only)."""
        reasoning: list[StreamDelta] = [ReasoningDelta(ev.reasoning)] if ev.reasoning else []
        return [*reasoning, *self.shape.feed(ev.text)]

    def _answer(
        self,
        content: str,
        reason: str,
        logprobs: Sequence[TokenLogprob],
        metrics: RequestMetrics | None,
        completion_tokens: int,
    ) -> FinishedAnswer:
        return FinishedAnswer(
            content=content,
            calls=list(self.shape.calls),
            finish_reason=reason,
            logprobs=logprobs,
            metrics=metrics,
            prompt_tokens=len(self.given.prompt_ids),
            completion_tokens=completion_tokens,
        )

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
