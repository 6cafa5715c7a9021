"""OpenAI's routes: chat completions and text completions (the model list: model_routes).

Each handler checks the model name, templates and tokenizes the prompt off the event loop, and
hands the rest to ``generation``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from localinfer.engine.types import SamplingParams
from localinfer.server.answer_render import OpenAIRenderer
from localinfer.server.chat_plan import plan_chat
from localinfer.server.generation import GenerationInput, generate
from localinfer.server.responses import Kind, ResponseBuilder
from localinfer.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.structured_output import response_format_spec
from localinfer.server.translate import (
    check_chat,
    check_completion,
    completion_prompt,
    sampling_params,
)

# OpenAI's legacy /v1/completions default; chat answers may run to the end of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def add_openai_routes(app: FastAPI, state: ServerState) -> None:
    """``/v1/chat/completions`` and ``/v1/completions`` on ``app``."""

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        current = await state.session_for(request, body.model)
        logprobs = check_chat(body)
        plan = await run_in_threadpool(plan_chat, current, body)
        max_tokens = body.max_completion_tokens or body.max_tokens
        given = GenerationInput(
            plan.prompt_ids,
            openai_params(body, current, plan.prompt_ids, logprobs, max_tokens),
            body.stream,
            OpenAIRenderer(openai_builder("chat", body, state, current, logprobs)),
            constraint=plan.constraint,
            shape=plan.shape,
        )
        return await generate(state, current, request, given)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        current = await state.session_for(request, body.model)
        return await run_completion(state, current, request, body, "completion")


async def run_completion(
    state: ServerState,
    session: ServedSession,
    request: Request,
    body: CompletionRequest,
    kind: Kind,
    default_max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS,
) -> Response:
    """A text completion (a fill-in-the-middle one with ``suffix``), answered as ``kind``:
    text completions, or chat completions for FIM APIs that answer that way (Mistral's)."""
    logprobs = check_completion(body)
    prompt = await run_in_threadpool(completion_prompt, session, body, state.name_of(session))
    text = prompt.text
    if body.echo and not text:  # a token-id prompt: echo its text
        text = session.model.tokenizer.decode(prompt.ids)
    max_tokens = default_max_tokens if body.max_tokens is None else body.max_tokens
    params = openai_params(body, session, prompt.ids, logprobs, max_tokens)
    if prompt.stop_token_ids:
        params = params.model_copy(update={"stop_token_ids": prompt.stop_token_ids})
    spec = response_format_spec(body.response_format)
    constraint = None
    if spec is not None:
        constraint = await run_in_threadpool(session.compile_constraint, spec)
    builder = openai_builder(kind, body, state, session, logprobs)
    given = GenerationInput(
        prompt.ids,
        params,
        body.stream,
        OpenAIRenderer(builder, echo=text if body.echo else ""),
        constraint=constraint,
    )
    return await generate(state, session, request, given)


def openai_params(
    body: SamplingFields,
    session: ServedSession,
    prompt_ids: list[int],
    logprobs: int | None,
    max_tokens: int | None,
) -> SamplingParams:
    return sampling_params(
        body,
        prompt_tokens=len(prompt_ids),
        max_ctx=session.engine.max_ctx,
        logprobs=logprobs,
        max_tokens=max_tokens,
    )


def openai_builder(
    kind: Kind,
    body: SamplingFields,
    state: ServerState,
    session: ServedSession,
    logprobs: int | None,
) -> ResponseBuilder:
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    return ResponseBuilder(
        kind,
        model=state.name_of(session),
        token_bytes=session.model.tokenizer.token_bytes,
        want_logprobs=logprobs is not None,
        include_usage=include_usage,
    )
