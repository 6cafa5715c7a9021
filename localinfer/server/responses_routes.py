"""OpenAI's Responses API: ``POST /v1/responses`` (issue #21), as used by Codex CLI and newer
OpenAI-based tools.

The request is translated into a chat completion request (``responses_api_translate``), planned
and sampled exactly like one, run by ``generation`` and written by ``ResponsesRenderer``. Nothing
is stored: ``store`` must be false (an absent ``store`` counts as false).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from localinfer.server.generation import GenerationInput, generate
from localinfer.server.responses_api_render import ResponseHead, ResponsesRenderer
from localinfer.server.responses_api_schemas import ResponsesRequest
from localinfer.server.responses_api_translate import (
    echoed_text,
    echoed_tools,
    plan_responses,
    translate_request,
)
from localinfer.server.state import ServerState
from localinfer.server.translate import DEFAULT_TEMPERATURE, sampling_params

DEFAULT_TOP_P = 1.0  # what OpenAI echoes when a request leaves top_p out


def add_responses_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/responses`` on ``app``."""

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        current = await state.session_for(request, body.model)
        translated = translate_request(body)
        plan = await run_in_threadpool(plan_responses, current, translated)
        params = sampling_params(
            translated.chat,
            prompt_tokens=len(plan.prompt_ids),
            max_ctx=current.engine.max_ctx,
            logprobs=None,
            max_tokens=body.max_output_tokens,
        )
        given = GenerationInput(
            plan.prompt_ids,
            params,
            body.stream,
            ResponsesRenderer(response_head(body, state.name_of(current))),
            constraint=plan.constraint,
            shape=plan.shape,
        )
        return await generate(state, current, request, given)


def response_head(body: ResponsesRequest, model: str) -> ResponseHead:
    """The request's settings as every Response object of its answer repeats them."""
    return ResponseHead(
        model=model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=DEFAULT_TOP_P if body.top_p is None else body.top_p,
        parallel_tool_calls=body.parallel_tool_calls,
        tool_choice=body.tool_choice or "auto",
        tools=echoed_tools(body.tools),
        text=echoed_text(body.text),
    )
