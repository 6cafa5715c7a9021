"""OpenAI's Responses API: ``POST /v1/responses`` (issue #21), as used by Codex CLI and newer
OpenAI-based tools.

The request is translated into a chat completion request (``responses_api_translate``), planned
and sampled exactly like one, run by ``answer_route`` and written by ``ResponsesRenderer``. Nothing
is stored: ``store`` must be false (an absent ``store`` counts as false).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from localinfer.server.answer_route import add_answer_route, chat_input, engine_params
from localinfer.server.generation import GenerationInput
from localinfer.server.responses_api_render import ResponseHead, ResponsesRenderer
from localinfer.server.responses_api_schemas import ResponsesRequest
from localinfer.server.responses_api_translate import (
    echoed_text,
    echoed_tools,
    plan_responses,
    translate_request,
)
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.translate import DEFAULT_TEMPERATURE

DEFAULT_TOP_P = 1.0  # what OpenAI echoes when a request leaves top_p out


def add_responses_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/responses`` on ``app``."""
    add_answer_route(
        app, state, "/v1/responses", ResponsesRequest, response, name="create_response"
    )


def response(session: ServedSession, model: str, body: ResponsesRequest) -> GenerationInput:
    """The chat turn ``body`` amounts to, its parameters and its renderer."""
    translated = translate_request(body)
    plan = plan_responses(session, translated)
    params = engine_params(
        translated.chat, session, plan.prompt_ids, logprobs=None, max_tokens=body.max_output_tokens
    )
    renderer = ResponsesRenderer(response_head(body, model))
    return chat_input(plan, params, body.stream, renderer)


def echoed_choice(body: ResponsesRequest) -> str | dict[str, Any]:
    """The request's ``tool_choice`` as a Response object repeats it (OpenAI's default: auto)."""
    choice = body.tool_choice
    if isinstance(choice, BaseModel):
        return choice.model_dump()
    return choice or "auto"


def response_head(body: ResponsesRequest, model: str) -> ResponseHead:
    """The request's settings as every Response object of its answer repeats them."""
    return ResponseHead(
        model=model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=DEFAULT_TOP_P if body.top_p is None else body.top_p,
        parallel_tool_calls=body.parallel_tool_calls,
        tool_choice=echoed_choice(body),
        tools=echoed_tools(body.tools),
        text=echoed_text(body.text),
        reasoning_effort=body.reasoning.effort if body.reasoning is not None else None,
    )
