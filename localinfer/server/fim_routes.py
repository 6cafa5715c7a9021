"""Fill-in-the-middle autocomplete: ``/v1/fim/completions`` (issue #21).

Mistral's FIM API, which Continue and other editors post to when a provider says it does FIM:
``{"model", "prompt" (the text before the cursor), "suffix" (the text after it), "max_tokens",
"temperature", "top_p", "stop", "stream", ...}``, answered as a chat completion (whole: the middle
in ``choices[0].message.content``; streamed: ``choices[0].delta.content`` chunks). The body is
translated into a text completion with ``suffix`` and run as ``/v1/completions`` runs one, so the
FIM format (the model's own tokens, ``localinfer.fim``), sampling and stops are the same on both
routes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI

from localinfer.server.answer_route import add_answer_route
from localinfer.server.generation import GenerationInput
from localinfer.server.json_numbers import JsonInt
from localinfer.server.openai_routes import completion
from localinfer.server.schemas import CompletionRequest, SamplingFields
from localinfer.server.state import ServedSession, ServerState


class FimCompletionRequest(SamplingFields):
    """Mistral's ``/v1/fim/completions`` body (fields it has and this server does not act on,
    such as ``min_tokens``, are ignored like any unknown field)."""

    prompt: str  # the text before the cursor
    suffix: str = ""  # the text after it; empty: complete at the end
    max_completion_tokens: Annotated[int, JsonInt(ge=1)] | None = None  # Continue sends it
    random_seed: Annotated[int, JsonInt(ge=0, le=2**64 - 1)] | None = None  # Mistral's seed

    def as_completion(self) -> CompletionRequest:
        fields = self.model_dump(include=set(SamplingFields.model_fields))
        fields["max_tokens"] = self.max_tokens or self.max_completion_tokens
        if self.seed is None:
            fields["seed"] = self.random_seed
        return CompletionRequest(**fields, prompt=self.prompt, suffix=self.suffix)


def add_fim_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/fim/completions`` on ``app``."""
    add_answer_route(
        app,
        state,
        "/v1/fim/completions",
        FimCompletionRequest,
        fim_completion,
        name="fim_completions",
    )


def fim_completion(
    session: ServedSession, model: str, body: FimCompletionRequest
) -> GenerationInput:
    """The text completion ``body`` amounts to, answered as a chat completion; Mistral's
    default: the middle may run to the end of the context."""
    return completion(session, model, body.as_completion(), "chat", default_max_tokens=None)
