"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens (issue #21).

A request is translated into an OpenAI chat request (``anthropic_translate``) and planned and
sampled like one (``plan_chat``, ``engine_params``); the answer runs through ``answer_route``
and is written as Anthropic's ``message`` or event stream (``anthropic_render``). Errors on
these paths take Anthropic's shape (``errors``), and ``x-api-key`` authenticates (``auth``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from localinfer.server.answer_route import (
    ANSWER_ERRORS,
    add_answer_route,
    chat_input,
    engine_params,
)
from localinfer.server.anthropic_render import AnthropicRenderer, ThinkingShown
from localinfer.server.anthropic_schemas import (
    CountTokensRequest,
    MessagesRequest,
    ThinkingConfig,
)
from localinfer.server.anthropic_translate import anthropic_fields, chat_request
from localinfer.server.chat_plan import ChatPlan, plan_chat
from localinfer.server.generation import GenerationInput
from localinfer.server.image_fetch import image_fetch_for_request
from localinfer.server.openapi_doc import error_responses
from localinfer.server.state import ServedSession, ServerState


class TokenCount(BaseModel):
    input_tokens: int


def add_anthropic_routes(app: FastAPI, state: ServerState) -> None:
    """``/v1/messages`` and ``/v1/messages/count_tokens`` on ``app``."""

    add_answer_route(app, state, "/v1/messages", MessagesRequest, message, name="messages")

    count_path = "/v1/messages/count_tokens"

    @app.post(count_path, responses=error_responses(count_path, *ANSWER_ERRORS))
    async def count_tokens(body: CountTokensRequest, request: Request) -> TokenCount:
        current = await state.session_for(request, body.model)
        with image_fetch_for_request(state.image_fetch):  # an image URL is counted fetched
            plan = await run_in_threadpool(plan_prompt, current, body)
        return TokenCount(input_tokens=len(plan.prompt_ids))


def plan_prompt(session: ServedSession, body: CountTokensRequest) -> ChatPlan:
    """The prompt (with its tools), constraint and answer shape of ``body``; a 400 names the
    field of the Anthropic request at fault."""
    chat = chat_request(body)
    with anthropic_fields(chat.origins, chat.parts):
        return plan_chat(session, chat.request)


def message(session: ServedSession, model: str, body: MessagesRequest) -> GenerationInput:
    """``plan_prompt``, the engine's parameters for the answer and its renderer."""
    chat = chat_request(body)
    with anthropic_fields(chat.origins, chat.parts):
        plan = plan_chat(session, chat.request)
        params = engine_params(
            chat.request, session, plan.prompt_ids, logprobs=None, max_tokens=body.max_tokens
        )
    renderer = AnthropicRenderer(model, len(plan.prompt_ids), thinking_shown(body.thinking))
    return chat_input(plan, params, body.stream, renderer)


def thinking_shown(thinking: ThinkingConfig | None) -> ThinkingShown:
    """Whether the answer carries thinking blocks: only when the request enabled thinking (a
    request that does not mention it gets the model's default thinking, kept out of the text
    and not shown; see anthropic_render)."""
    if thinking is None or thinking.type == "disabled":
        return None
    return "omitted" if thinking.display == "omitted" else "text"
