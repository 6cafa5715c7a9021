"""Embeddings: ``POST /v1/embeddings`` in OpenAI's shape (issue #21).

    {"input": "text" | ["text", ...] | [ids...] | [[ids...], ...], "model": "...",
     "encoding_format": "float" | "base64", "dimensions": N}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...]}],
        "model": "...", "usage": {"prompt_tokens": N, "total_tokens": N}}

Texts are tokenized as raw text (BOS where the model wants one; no chat template); token ids are
used as given. The job runs through the engine's queue (localinfer/engine/embedding.py), pooled
as the model declares (localinfer/loading/embedding_spec.py). ``base64`` is the vector's
little-endian float32 bytes, as OpenAI sends them (its SDK decodes them itself). ``dimensions``
keeps each vector's first N components, renormalised (``embedding_spec``). An input longer than
the context is refused, never truncated.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from localinfer.engine import EmbeddingRequest
from localinfer.errors import InvalidParameterError
from localinfer.loading.embedding_spec import embedding_spec, shortened
from localinfer.server.answer_route import ANSWER_ERRORS
from localinfer.server.capability import capability_refused
from localinfer.server.errors import APIError, from_localinfer_error
from localinfer.server.json_numbers import Integer, JsonInt
from localinfer.server.model_ids import ModelId
from localinfer.server.openapi_doc import error_responses
from localinfer.server.protocol import settle_arrival
from localinfer.server.state import ServedSession, ServerState

PATH = "/v1/embeddings"
# OpenAI's limit on inputs per request.
MAX_INPUTS = 2048
_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
INPUT_SCHEMA = {
    "anyOf": [
        _TEXT,
        {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": MAX_INPUTS},
        _IDS,
        {"type": "array", "items": _IDS, "minItems": 1, "maxItems": MAX_INPUTS},
    ]
}


class EmbeddingsBody(BaseModel):
    """OpenAI's embeddings request; unknown fields (``user``) are ignored."""

    model_config = ConfigDict(extra="ignore")

    # Validated by input_ids, whose 400s name the input at fault ("input[1]: empty"); the
    # document states the same rules: every input has at least one token, at most MAX_INPUTS.
    input: Annotated[
        str | list[str] | list[Integer] | list[list[Integer]], WithJsonSchema(INPUT_SCHEMA)
    ]
    model: ModelId | None = None
    encoding_format: Literal["float", "base64"] = "float"
    # Any length from 1 to the model's width: the first components, renormalised. No maximum
    # in the document: the width is the model's (576 for the embedded one, thousands for
    # larger models, and a pool loads models on request), so no one bound is true of the
    # server. More than the model's width is what this model cannot give, not a malformed
    # value: a 404 naming the model (``capability``), as for a model without FIM tokens; a
    # wider model would answer it.
    dimensions: Annotated[int, JsonInt(ge=1)] | None = None


def add_embedding_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/embeddings`` on ``app``."""

    @app.post(
        "/v1/embeddings", response_model=None, responses=error_responses(PATH, *ANSWER_ERRORS)
    )
    async def embeddings(body: EmbeddingsBody, request: Request) -> JSONResponse:
        current = await state.session_for(request, body.model)
        name = state.name_of(current)
        # A pooling localinfer does not compute (a reranker's), a runner without embeddings
        # (engine.embed) and vectors longer than the model's: 404s naming the model.
        with capability_refused(name, "give embeddings"):
            spec = embedding_spec(current.model)
        with capability_refused(name, "give vectors that long", param="dimensions"):
            cut = spec.check_dimensions(body.dimensions)
        ids = await run_in_threadpool(input_ids, current, body.input)
        check_lengths(ids, current.engine.max_ctx)
        try:
            with capability_refused(name, "give embeddings"):
                settle_arrival(request.scope)
                handle = current.engine.embed(EmbeddingRequest(ids, spec.pooling))
        except InvalidParameterError as exc:  # "input[2]: token id ...": OpenAI's param is input
            raise from_localinfer_error(exc, param="input") from None
        try:
            result = await run_in_threadpool(handle.result)
        except asyncio.CancelledError:  # the client went away: stop the job
            handle.abort()
            raise
        vectors = shortened(result.vectors, cut)
        tokens = result.prompt_tokens
        return JSONResponse(embeddings_response(vectors, body.encoding_format, name, tokens))


def input_ids(session: ServedSession, given: Any) -> list[list[int]]:
    """Every input as token ids; 400s naming ``input`` for an empty or oversized list."""
    if isinstance(given, str):
        given = [given]
    elif given and isinstance(given[0], int):
        given = [given]  # one input given as token ids
    if not given:
        raise bad_input("input: empty; give a string, strings or token ids")
    if len(given) > MAX_INPUTS:
        raise bad_input(f"input: {len(given)} inputs; at most {MAX_INPUTS} per request")
    out = []
    for i, item in enumerate(given):
        ids = session.raw_prompt_ids(item) if isinstance(item, str) else list(item)
        if not item or not ids:
            raise bad_input(f"input[{i}]: empty; every input needs at least one token")
        out.append(ids)
    return out


def bad_input(message: str) -> APIError:
    """A 400 about ``input``, coded as InvalidParameterError's are."""
    return APIError(400, message, code=InvalidParameterError.code, param="input")


def check_lengths(ids: list[list[int]], max_ctx: int) -> None:
    for i, tokens in enumerate(ids):
        if len(tokens) > max_ctx:
            raise APIError(
                400,
                f"input[{i}]: {len(tokens)} tokens, more than the context holds ({max_ctx}); "
                "shorten it or serve with a larger --ctx (nothing was truncated)",
                code="context_length_exceeded",
                param="input",
            )


def embeddings_response(
    vectors: np.ndarray, encoding: str, model: str, tokens: int
) -> dict[str, Any]:
    """OpenAI's response body for ``vectors`` ([n, dims] float32)."""
    data = []
    for i, vector in enumerate(vectors):
        if encoding == "base64":
            value: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        else:
            value = vector.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
