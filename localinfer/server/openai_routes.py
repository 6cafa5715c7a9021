"""OpenAI's routes: chat completions and text completions (the model list: model_routes).

Each route says how its body becomes a prompt, the engine's parameters and an
``OpenAIRenderer``; ``answer_route`` runs the rest (model lookup, planning off the event loop,
generation).
"""

from __future__ import annotations

from fastapi import FastAPI

from localinfer.server.answer_route import add_answer_route, chat_input, engine_params
from localinfer.server.chat_plan import plan_chat
from localinfer.server.generation import GenerationInput
from localinfer.server.openai_render import Kind, OpenAIRenderer, ResponseBuilder
from localinfer.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from localinfer.server.state import ServedSession, ServerState
from localinfer.server.structured_output import response_format_spec
from localinfer.server.translate import (
    check_chat,
    check_completion,
    check_token_ids,
    completion_prompt,
)

# OpenAI's legacy /v1/completions default; chat answers may run to the end of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def add_openai_routes(app: FastAPI, state: ServerState) -> None:
    """``/v1/chat/completions`` and ``/v1/completions`` on ``app``."""
    add_answer_route(
        app,
        state,
        "/v1/chat/completions",
        ChatCompletionRequest,
        chat_completion,
        name="chat_completions",
    )
    add_answer_route(
        app, state, "/v1/completions", CompletionRequest, text_completion, name="completions"
    )


def chat_completion(
    session: ServedSession, model: str, body: ChatCompletionRequest
) -> GenerationInput:
    """A chat completion's prompt (with its tools and constraint), parameters and renderer."""
    logprobs = check_chat(body)
    plan = plan_chat(session, body)
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = engine_params(body, session, plan.prompt_ids, logprobs=logprobs, max_tokens=max_tokens)
    builder = openai_builder("chat", body, model, session, logprobs)
    builder.dropped_messages = plan.dropped
    return chat_input(plan, params, body.stream, OpenAIRenderer(builder))


def text_completion(session: ServedSession, model: str, body: CompletionRequest) -> GenerationInput:
    """``/v1/completions``: a text completion answered as one."""
    return completion(session, model, body, "completion")


def completion(
    session: ServedSession,
    model: str,
    body: CompletionRequest,
    kind: Kind,
    default_max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS,
) -> GenerationInput:
    """A text completion (a fill-in-the-middle one with ``suffix``), answered as ``kind``:
    text completions, or chat completions for FIM APIs that answer that way (Mistral's)."""
    logprobs = check_completion(body)
    prompt = completion_prompt(session, body, model)
    check_token_ids(prompt.ids, session.engine.vocab_size)
    text = prompt.text
    if body.echo and not text:  # a token-id prompt: echo its text
        text = session.model.tokenizer.decode(prompt.ids)
    max_tokens = default_max_tokens if body.max_tokens is None else body.max_tokens
    params = engine_params(body, session, prompt.ids, logprobs=logprobs, max_tokens=max_tokens)
    if prompt.stop_token_ids:
        params = params.model_copy(update={"stop_token_ids": prompt.stop_token_ids})
    spec = response_format_spec(body.response_format)
    constraint = None if spec is None else session.compile_constraint(spec)
    builder = openai_builder(kind, body, model, session, logprobs)
    return GenerationInput(
        prompt.ids,
        params,
        body.stream,
        OpenAIRenderer(builder, echo=text if body.echo else ""),
        constraint=constraint,
    )


def openai_builder(
    kind: Kind,
    body: SamplingFields,
    model: str,
    session: ServedSession,
    logprobs: int | None,
) -> ResponseBuilder:
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    return ResponseBuilder(
        kind,
        model=model,
        token_bytes=session.model.tokenizer.token_bytes,
        want_logprobs=logprobs is not None,
        include_usage=include_usage,
    )
