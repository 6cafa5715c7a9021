"""The skeleton every route that answers with generated text shares (chat and text completions,
FIM, Anthropic's Messages, the Responses API); a route module keeps only what its API differs in.

    1. the model's session (an unknown model is a 404, one still loading a 503), before anything
       of the body is checked;
    2. ``prepare(session, model, body)``: the API's checks, its translation, templating and
       tokenizing, the constraint, the engine's parameters and the renderer (``model`` is the
       name clients see, for the renderer to echo). A small body is prepared on the event loop:
       its work takes well under a millisecond, less than the two thread hand-offs of a worker
       thread, which wait for a core while the model's threads hold both (they add to the time
       to the first token). A large one, or one that may fetch image URLs, goes to a worker
       thread so the loop keeps streaming other answers meanwhile;
    3. ``generation.generate``: admission, a whole answer or a stream, and the API's errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from localinfer.engine.types import SamplingParams
from localinfer.server.answer_render import AnswerRenderer
from localinfer.server.chat_plan import ChatPlan
from localinfer.server.generation import GenerationInput, generate
from localinfer.server.image_fetch import image_fetch_for_request
from localinfer.server.openapi_doc import STREAMED, error_responses
from localinfer.server.overflow import REQUEST_OVERFLOW, OverflowSetting
from localinfer.server.schemas import SamplingFields
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.translate import sampling_params


class NamesModel(Protocol):
    """A request body: it names the model to answer with (empty: the default one)."""

    @property
    def model(self) -> str | None: ...


Body = TypeVar("Body", bound=NamesModel)

# (session, the model's name as clients see it, the body) -> what to generate and how to write it.
Prepare = Callable[[ServedSession, str, Body], GenerationInput]

# Bodies up to this size are prepared on the event loop (see step 2 above).
INLINE_BODY_BYTES = 16 * 1024

# A bad body or id, a model not served, busy or loading, a model that never fits.
ANSWER_ERRORS = (400, 404, 503, 507)


def add_answer_route(
    app: FastAPI,
    state: ServerState,
    path: str,
    body_type: type[Body],
    prepare: Prepare[Body],
    *,
    name: str,
) -> None:
    """``POST path`` on ``app``: a ``body_type`` body answered in the three steps above;
    ``name`` names the route (and its operation in /openapi.json)."""

    async def handler(body: Any, request: Request) -> Response:
        session = await state.session_for(request, body.model)
        # The worker thread planning it sees this request's overflow policy (overflow.py).
        overflow = OverflowSetting(state.context_overflow, session.engine.max_ctx)
        token = REQUEST_OVERFLOW.set(overflow)
        try:
            name = state.name_of(session)
            if prepares_inline(request, state):
                given = prepare(session, name, body)
            else:
                with image_fetch_for_request(state.image_fetch):  # serve --allow-image-urls
                    given = await run_in_threadpool(prepare, session, name, body)
        finally:
            REQUEST_OVERFLOW.reset(token)
        return await generate(state, session, request, given)

    # FastAPI validates the body against, and documents, the type annotated here.
    handler.__annotations__["body"] = body_type
    responses = {200: STREAMED, **error_responses(path, *ANSWER_ERRORS)}
    app.post(path, name=name, responses=responses)(handler)


def prepares_inline(request: Request, state: ServerState) -> bool:
    """Whether a body is small enough to prepare on the event loop: its declared length is at
    most INLINE_BODY_BYTES, and the server fetches no image URLs (a fetch blocks)."""
    if state.image_fetch is not None:
        return False
    length = request.headers.get("content-length", "")
    return length.isdigit() and int(length) <= INLINE_BODY_BYTES


def engine_params(
    fields: SamplingFields,
    session: ServedSession,
    prompt_ids: list[int],
    *,
    logprobs: int | None,
    max_tokens: int | None,
) -> SamplingParams:
    """The engine's parameters for an answer to ``prompt_ids`` (a 400 when no answer token
    fits in the session's context)."""
    return sampling_params(
        fields,
        prompt_tokens=len(prompt_ids),
        max_ctx=session.engine.max_ctx,
        logprobs=logprobs,
        max_tokens=max_tokens,
    )


def chat_input(
    plan: ChatPlan, params: SamplingParams, stream: bool, renderer: AnswerRenderer
) -> GenerationInput:
    """A planned chat turn (``plan_chat``) as ``generate`` takes it."""
    return GenerationInput(
        plan.prompt_ids,
        params,
        stream,
        renderer,
        constraint=plan.constraint,
        shape=plan.shape,
        reasoning=plan.reasoning,
        images=plan.images,
        dropped=plan.dropped,
    )
