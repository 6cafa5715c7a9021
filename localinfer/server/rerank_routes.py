"""Reranking: ``POST /v1/rerank`` and ``POST /rerank`` in Jina's and Cohere's shape, as
llama-server serves them (issue #37).

    {"model": "...", "query": "text", "documents": ["text", ...], "top_n": N,
     "return_documents": false}
    -> {"model": "...", "object": "list", "usage": {"prompt_tokens": N, "total_tokens": N},
        "results": [{"index": 2, "relevance_score": 0.93, "document": {"text": "..."}}, ...]}

Results are sorted by score, highest first (ties keep the documents' order), cut to ``top_n``
(all by default); ``document`` only with ``return_documents``. A score is the first output of
the reranker's head (Qwen3-Reranker: P("yes"); bge-reranker: a logit), as llama-server gives it.
Each (query, document) pair is formatted as llama-server formats it (loading/rerank_spec.py) and
scored by the engine as an embedding job is run: through its queue, beside the answers being
generated, paced as embeddings are (engine/embedding.py). A model that is no reranker is a 400
naming it (an invalid_request_error, ``param`` "model"); a reranker on a runner that computes
no rank pooling is a 404, as a model that cannot give embeddings is (capability.py); a pair
longer than the context is a 400 naming its document (nothing is truncated).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from localinfer.engine import EmbeddingRequest
from localinfer.engine.embedding import check_ranks
from localinfer.errors import InvalidParameterError
from localinfer.facts.pooling import RANK
from localinfer.loading.rerank_spec import (
    NotARerankerError,
    PairTooLongError,
    pairs_ids,
    ranked,
    rerank_spec,
)
from localinfer.server.answer_route import ANSWER_ERRORS
from localinfer.server.capability import capability_refused
from localinfer.server.errors import from_localinfer_error
from localinfer.server.json_numbers import JsonInt
from localinfer.server.json_response import SafeJSONResponse
from localinfer.server.model_ids import ModelId
from localinfer.server.openapi_doc import error_responses
from localinfer.server.protocol import settle_arrival
from localinfer.server.state import ServerState

PATHS = ("/v1/rerank", "/rerank")
MAX_DOCUMENTS = 1000  # Cohere's limit per request


class RerankBody(BaseModel):
    """Jina's and Cohere's rerank request; unknown fields (``rank_fields``...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    query: Annotated[str, Field(min_length=1)]
    documents: Annotated[list[str], Field(min_length=1, max_length=MAX_DOCUMENTS)]
    model: ModelId | None = None
    # None: every document, as llama-server answers; more than there are: every document.
    top_n: Annotated[int, JsonInt(ge=1)] | None = None
    return_documents: bool = False


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    model: str
    object: str = "list"
    usage: RerankUsage
    results: list[RerankResult]


def add_rerank_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/rerank`` and ``POST /rerank`` on ``app``."""

    async def rerank(body: RerankBody, request: Request) -> JSONResponse:
        current = await state.session_for(request, body.model)
        name = state.name_of(current)
        try:
            spec = rerank_spec(current.model, name)
        except NotARerankerError as exc:  # the request's mistake, not the runner's lack
            raise from_localinfer_error(exc, param="model") from None
        with capability_refused(name, "rerank"):
            check_ranks(current.engine.runner)
        try:
            ids = await run_in_threadpool(
                pairs_ids, current.model.tokenizer, spec, body.query, body.documents,
                current.engine.max_ctx,
            )  # fmt: skip
            settle_arrival(request.scope)
            handle = current.engine.embed(EmbeddingRequest(ids, RANK))
        except PairTooLongError as exc:
            raise from_localinfer_error(exc, param=exc.field) from None
        except InvalidParameterError as exc:  # "documents[2]: ..." names its document
            raise from_localinfer_error(exc) from None
        try:
            result = await run_in_threadpool(handle.result)
        except asyncio.CancelledError:  # the client went away: stop the job
            handle.abort()
            raise
        scores = result.vectors[:, 0]
        answer = rerank_response(name, scores, body, result.prompt_tokens)
        # Safe: a returned document may hold a lone surrogate, which UTF-8 cannot encode.
        return SafeJSONResponse(answer.model_dump(exclude_none=True))

    for path in PATHS:
        app.post(
            path,
            response_model=RerankResponse,
            responses=error_responses(path, *ANSWER_ERRORS),
            summary="Rerank documents by their relevance to a query",
        )(rerank)


def rerank_response(
    model: str, scores: np.ndarray, body: RerankBody, tokens: int
) -> RerankResponse:
    results = [
        RerankResult(
            index=i,
            relevance_score=float(scores[i]),
            document={"text": body.documents[i]} if body.return_documents else None,
        )
        for i in ranked(scores, body.top_n)
    ]
    usage = RerankUsage(prompt_tokens=tokens, total_tokens=tokens)
    return RerankResponse(model=model, usage=usage, results=results)
