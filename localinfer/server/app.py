"""The HTTP app: ``create_app(session)`` -> FastAPI.

    GET  /health                     {"status": "ok" | "loading" | "error"}
    GET  /metrics                    Prometheus text
    GET  /openapi.json               every route's schema
    GET  /v1/models                  the models served: loaded, loading, available (model_routes)
    POST /v1/models/{id}/load        load a model now; /unload unloads an idle one (model_routes)
    POST /v1/chat/completions        chat (tools, response_format), streaming (SSE) or not
    POST /v1/completions             raw text completion (suffix: fill-in-the-middle)
    POST /v1/fim/completions         Mistral's FIM body (fim_routes)
    POST /v1/embeddings              embeddings (embedding_routes)
    POST /v1/rerank                  rerank documents by a query, also /rerank (rerank_routes)
    POST /v1/messages                Anthropic's Messages API, + /count_tokens (anthropic_routes)
    POST /v1/responses               OpenAI's Responses API (responses_routes)

HTTP handlers parse, template and tokenize; only the engine's thread touches the model (the
llama.cpp server's split). Every API translates into the same engine request; ``generation``
runs it and an API's renderer writes the answer (``answer_render``). Errors are OpenAI's JSON
(Anthropic's on /v1/messages), an unknown route's too (it lists the routes above).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from localinfer import __version__
from localinfer.context_fit import OverflowPolicy
from localinfer.errors import InvalidParameterError
from localinfer.server.anthropic_routes import add_anthropic_routes
from localinfer.server.auth import APIKeyMiddleware
from localinfer.server.embedding_routes import add_embedding_routes
from localinfer.server.errors import install_error_handlers
from localinfer.server.fim_routes import add_fim_routes
from localinfer.server.host_guard import HostGuardMiddleware, HostPolicy
from localinfer.server.image_fetch import ImageFetch
from localinfer.server.json_response import SafeJSONResponse
from localinfer.server.limits import BodyLimitMiddleware, RequestLimits
from localinfer.server.model_pool import ModelPool
from localinfer.server.model_routes import add_model_routes
from localinfer.server.openai_routes import add_openai_routes
from localinfer.server.openapi_doc import install_openapi
from localinfer.server.ops_routes import add_ops_routes
from localinfer.server.rerank_routes import add_rerank_routes
from localinfer.server.responses_routes import add_responses_routes
from localinfer.server.state import (
    LeaseMiddleware,
    ServedSession,
    ServerState,
    SessionLoader,
    StartUp,
    handed_pool,
)


def create_app(
    session: ServedSession | None = None,
    *,
    loader: SessionLoader | None = None,
    pool: ModelPool | None = None,
    start_up: StartUp | None = None,
    api_key: str | None = None,
    cors_origins: Iterable[str] = (),
    served_name: str | None = None,
    aliases: Iterable[str] = (),
    allowed_hosts: Iterable[str] = (),
    limits: RequestLimits | None = None,
    context_overflow: str = "stop",
    image_fetch: ImageFetch | None = None,
) -> FastAPI:
    """The app for ``session`` (owned by the caller), or for the session ``loader`` builds in a
    background thread once the server starts (owned, and closed, by the app), or for ``pool``
    (several models, loaded on demand; ``start_up`` loads its first ones in that thread).

    ``allowed_hosts`` adds names to the Host rule (``host_guard``; ``"*"`` turns it off and
    needs ``api_key``); ``limits`` bound what a request may send (``limits``);
    ``context_overflow`` is what a chat past the context gets (``overflow``); ``image_fetch``
    how image URLs are fetched (``image_fetch``; None, the default: they are refused)."""
    if sum(x is not None for x in (session, loader, pool)) != 1:
        raise ValueError("pass exactly one of session=, loader= or pool=")
    if api_key is not None and not api_key.strip():
        # An empty key must not quietly mean "no key".
        raise InvalidParameterError(
            "the API key is empty: give a key, or none to serve without authentication"
        )
    origins = list(cors_origins)
    policy = HostPolicy.build(allowed_hosts, cors_origins=origins, has_api_key=bool(api_key))
    limits = limits or RequestLimits()
    if pool is None:
        pool, start_up = handed_pool(session, loader, served_name, aliases)
    state = ServerState(pool)
    state.context_overflow = OverflowPolicy(context_overflow)
    state.image_fetch = image_fetch
    app = FastAPI(
        title="localinfer",
        version=__version__,
        lifespan=_lifespan(state, start_up),
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # Routes that return a dict (models, count_tokens) render it the same safe way.
        default_response_class=SafeJSONResponse,
    )
    app.state.localinfer = state
    app.state.request_limits = limits  # uvicorn_config reads the connection half from here
    app.state.arrivals = state.arrivals  # and the count of requests being read
    count_error = state.metrics.count_error
    install_error_handlers(app, on_error=count_error)
    install_openapi(app, api_key=bool(api_key), host_guard=not policy.any_host)
    # Added innermost first. A request meets them as: Host/Origin, CORS (so refusals below
    # carry its headers), the API key (before any body is read), the body limits, and the
    # model leases (given back when the response is over).
    app.add_middleware(LeaseMiddleware)
    app.add_middleware(BodyLimitMiddleware, limits=limits, on_error=count_error)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
        )
    app.add_middleware(HostGuardMiddleware, policy=policy, on_error=count_error)
    # Registered on the app itself, in this order: a 404 lists app.routes as they stand.
    add_ops_routes(app, state)
    add_model_routes(app, state)
    add_openai_routes(app, state)
    add_fim_routes(app, state)
    add_embedding_routes(app, state)
    add_rerank_routes(app, state)
    add_anthropic_routes(app, state)
    add_responses_routes(app, state)
    return app


def _lifespan(
    state: ServerState, start_up: StartUp | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Starts loading the start-up models with the server; unloads what the pool loaded after."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if start_up is not None:
            state.starting = True  # before the first request: it gets a 503, not a 404
            threading.Thread(
                target=state.start, args=(start_up,), name="localinfer-load", daemon=True
            ).start()
        yield
        state.close()

    return lifespan
