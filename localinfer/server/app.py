"""The OpenAI-compatible HTTP app: ``create_app(session)`` -> FastAPI.

    GET  /health                 {"status": "ok" | "loading" | "error"}
    GET  /metrics                Prometheus text
    GET  /v1/models              the one model served
    POST /v1/chat/completions    chat, streaming (SSE) or not
    POST /v1/completions         raw text completion, streaming or not

HTTP handlers parse, template and tokenize; only the engine's thread touches the model (the
llama.cpp server's split). Every response carries ``timings``; every error is OpenAI's JSON,
an unknown route's too (it lists the routes above).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from localinfer import __version__
from localinfer.engine.types import Request as EngineRequest
from localinfer.engine.types import StreamEvent
from localinfer.errors import InvalidParameterError, LocalinferError
from localinfer.server.auth import APIKeyMiddleware
from localinfer.server.errors import (
    APIError,
    error_body,
    from_localinfer_error,
    install_error_handlers,
)
from localinfer.server.host_guard import HostGuardMiddleware, HostPolicy
from localinfer.server.limits import BodyLimitMiddleware, RequestLimits
from localinfer.server.responses import Kind, ResponseBuilder
from localinfer.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from localinfer.server.state import ServedSession, ServerState, SessionLoader
from localinfer.server.streaming import (
    SSE_DONE,
    ClientGone,
    EventStreamResponse,
    collect,
    events_after,
    sse,
    unless_disconnected,
)
from localinfer.server.translate import (
    chat_prompt_ids,
    check_chat,
    check_completion,
    completion_prompt,
    sampling_params,
)

log = logging.getLogger(__name__)

# OpenAI's legacy /v1/completions default; chat answers may run to the end of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CLIENT_CLOSED = 499  # nginx's status for "client closed request"; only ever logged


def create_app(
    session: ServedSession | None = None,
    *,
    loader: SessionLoader | None = None,
    api_key: str | None = None,
    cors_origins: Iterable[str] = (),
    served_name: str | None = None,
    aliases: Iterable[str] = (),
    allowed_hosts: Iterable[str] = (),
    limits: RequestLimits | None = None,
) -> FastAPI:
    """The app for ``session`` (owned by the caller), or for the session ``loader`` builds in a
    background thread once the server starts (owned, and closed, by the app).

    ``allowed_hosts`` adds names to the Host rule (``host_guard``; ``"*"`` turns it off and
    needs ``api_key``); ``limits`` bound what a request may send (``limits``)."""
    if (session is None) == (loader is None):
        raise ValueError("pass exactly one of session= or loader=")
    if api_key is not None and not api_key.strip():
        # An empty key must not quietly mean "no key".
        raise InvalidParameterError(
            "the API key is empty: give a key, or none to serve without authentication"
        )
    origins = list(cors_origins)
    policy = HostPolicy.build(allowed_hosts, cors_origins=origins, has_api_key=bool(api_key))
    limits = limits or RequestLimits()
    state = ServerState(
        session, served_name=served_name, aliases=aliases, owns_session=loader is not None
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if loader is not None:
            threading.Thread(
                target=state.load, args=(loader,), name="localinfer-load", daemon=True
            ).start()
        yield
        state.close()

    app = FastAPI(
        title="localinfer",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.localinfer = state
    app.state.request_limits = limits  # uvicorn_config reads the connection half from here
    count_error = state.metrics.count_error
    install_error_handlers(app, on_error=count_error)
    # Added innermost first. A request meets them as: Host/Origin, CORS (so refusals below
    # carry its headers), the API key (before any body is read), the body limits.
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

    @app.get("/health")
    async def health() -> JSONResponse:
        current = state.session
        if current is not None:
            m = current.engine.metrics()
            return JSONResponse(
                {
                    "status": "ok",
                    "model": state.served_name,
                    "slots_total": m.slots_total,
                    "slots_busy": m.slots_busy,
                    "queue_depth": m.queue_depth,
                }
            )
        if state.load_error is not None:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        current = state.session
        snapshot = current.engine.metrics() if current is not None else None
        return PlainTextResponse(
            state.metrics.render(snapshot, state.served_name),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        current = state.ready()
        return {"object": "list", "data": [_model_card(state, current)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        current = state.ready()
        state.check_model(model_id)
        return _model_card(state, current)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        current = state.ready()
        state.check_model(body.model)
        logprobs = check_chat(body)
        prompt = await run_in_threadpool(chat_prompt_ids, current, body)
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await _generate(state, current, request, "chat", body, prompt, logprobs, max_tokens)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        current = state.ready()
        state.check_model(body.model)
        logprobs = check_completion(body)
        prompt, text = await run_in_threadpool(completion_prompt, current, body)
        if body.echo and not text:  # a token-id prompt: echo its text
            text = current.model.tokenizer.decode(prompt)
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return await _generate(
            state,
            current,
            request,
            "completion",
            body,
            prompt,
            logprobs,
            max_tokens,
            echo=text if body.echo else "",
        )

    return app


def _model_card(state: ServerState, session: ServedSession) -> dict[str, Any]:
    engine = session.engine
    return {
        "id": state.served_name,
        "object": "model",
        "created": 0,
        "owned_by": "localinfer",
        "max_model_len": engine.max_ctx,  # per request (per slot)
        "meta": {"backend": engine.runner.info.backend, "slots": engine.runner.info.slots},
    }


async def _generate(
    state: ServerState,
    session: ServedSession,
    request: Request,
    kind: Kind,
    body: SamplingFields,
    prompt_ids: list[int],
    logprobs: int | None,
    max_tokens: int | None,
    *,
    echo: str = "",
) -> Response:
    engine = session.engine
    params = sampling_params(
        body,
        prompt_tokens=len(prompt_ids),
        max_ctx=engine.max_ctx,
        logprobs=logprobs,
        max_tokens=max_tokens,
    )
    builder = ResponseBuilder(
        kind,
        model=state.served_name,
        token_bytes=session.model.tokenizer.token_bytes,
        want_logprobs=logprobs is not None,
        include_usage=bool(
            body.stream and body.stream_options and body.stream_options.include_usage
        ),
    )
    rid = builder.id
    events = engine.stream(EngineRequest(prompt_ids, params, request_id=rid))

    async def first_event() -> StreamEvent:
        return await anext(events)

    def client_gone() -> Response:
        engine.abort(rid)
        state.metrics.count_disconnect()
        log.info("%s: client disconnected; request aborted", rid)
        return Response(status_code=CLIENT_CLOSED)

    # The engine admits (or refuses: queue full, context overflow) on the first step of the
    # stream, so the status line waits for that: errors still get their proper HTTP status.
    try:
        first = await unless_disconnected(first_event(), request.receive)
    except ClientGone:
        await events.aclose()
        return client_gone()
    except LocalinferError as exc:
        await events.aclose()
        raise from_localinfer_error(exc) from None

    if not body.stream:
        try:
            done = await unless_disconnected(collect(first, events), request.receive)
        except ClientGone:
            return client_gone()
        finally:
            await events.aclose()
        if done.finish_reason in ("error", "abort"):
            raise _failed(done.finish_reason, done.error)
        state.metrics.observe_request(done.metrics)
        return JSONResponse(
            builder.response(
                done.text,
                done.finish_reason,
                done.logprobs,
                done.metrics,
                len(prompt_ids),
                done.token_count,
                echo_prefix=echo,
            )
        )

    async def body_chunks() -> AsyncIterator[bytes]:
        try:
            head = builder.first_chunk(echo)
            if head is not None:
                yield sse(head)
            count = 0
            async for ev in events_after(first, events):
                count += len(ev.token_ids)
                chunk = builder.delta_chunk(ev.text, ev.logprobs)
                if chunk is not None:
                    yield sse(chunk)
                if ev.finish_reason is None:
                    continue
                if ev.finish_reason in ("error", "abort"):
                    err = _failed(ev.finish_reason, ev.error)
                    yield sse(error_body(err.status, err.message, code=err.code))
                    break
                state.metrics.observe_request(ev.metrics)
                yield sse(builder.finish_chunk(ev.finish_reason, ev.metrics))
                if builder.include_usage:
                    yield sse(builder.usage_chunk(ev.metrics, len(prompt_ids), count))
            yield SSE_DONE
        finally:
            await events.aclose()

    def on_close() -> None:
        if engine.abort(rid):  # False when the answer finished: nothing to free
            state.metrics.count_disconnect()
            log.info("%s: client disconnected mid-stream; request aborted", rid)

    return EventStreamResponse(body_chunks(), on_close)


def _failed(finish_reason: str, error: str | None) -> APIError:
    if finish_reason == "abort":
        return APIError(
            503, error or "the request was aborted (server shutting down)", code="aborted"
        )
    return APIError(500, error or "the engine failed on this request", code="engine_error")
