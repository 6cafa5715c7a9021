"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens (issue #21).

A request is translated into an OpenAI chat request (``anthropic_translate``) and planned and
sampled like one (``plan_chat``, ``sampling_params``); the answer runs through ``generation``
and is written as Anthropic's ``message`` or event stream (``anthropic_render``). Errors on
these paths take Anthropic's shape (``errors``), and ``x-api-key`` authenticates (``auth``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from localinfer.engine.types import SamplingParams
from localinfer.server.anthropic_render import AnthropicRenderer
from localinfer.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from localinfer.server.anthropic_translate import anthropic_fields, chat_request
from localinfer.server.chat_plan import ChatPlan, plan_chat
from localinfer.server.generation import GenerationInput, generate
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.translate import sampling_params


class TokenCount(BaseModel):
    input_tokens: int


def add_anthropic_routes(app: FastAPI, state: ServerState) -> None:
    """``/v1/messages`` and ``/v1/messages/count_tokens`` on ``app``."""

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        current = await state.session_for(request, body.model)
        plan, params = await run_in_threadpool(plan_messages, current, body)
        given = GenerationInput(
            plan.prompt_ids,
            params,
            body.stream,
            AnthropicRenderer(state.name_of(current), len(plan.prompt_ids)),
            constraint=plan.constraint,
            shape=plan.shape,
        )
        return await generate(state, current, request, given)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, request: Request) -> TokenCount:
        current = await state.session_for(request, body.model)
        plan = await run_in_threadpool(plan_prompt, current, body)
        return TokenCount(input_tokens=len(plan.prompt_ids))


def plan_prompt(session: ServedSession, body: CountTokensRequest) -> ChatPlan:
    """The prompt (with its tools), constraint and answer shape of ``body``; a 400 names the
    field of the Anthropic request at fault."""
    chat = chat_request(body)
    with anthropic_fields(chat.origins):
        return plan_chat(session, chat.request)


def plan_messages(session: ServedSession, body: MessagesRequest) -> tuple[ChatPlan, SamplingParams]:
    """``plan_prompt`` and the engine's parameters for the answer."""
    chat = chat_request(body)
    with anthropic_fields(chat.origins):
        plan = plan_chat(session, chat.request)
        params = sampling_params(
            chat.request,
            prompt_tokens=len(plan.prompt_ids),
            max_ctx=session.engine.max_ctx,
            logprobs=None,
            max_tokens=body.max_tokens,
        )
    return plan, params
