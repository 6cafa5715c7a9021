"""Optional API key on /v1/* and on the routes served outside /v1 (``/rerank``, as llama-server
names it); health and metrics stay open for probes and scrapers. Sent as
``Authorization: Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY`` (Anthropic's clients)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from localinfer.server.errors import APIError

# The model routes served outside /v1 too; the key guards them as it guards /v1/*.
KEYED_OUTSIDE_V1 = frozenset({"/rerank"})


def needs_key(path: str) -> bool:
    """Whether the API key guards ``path``."""
    return path == "/v1" or path.startswith("/v1/") or path in KEYED_OUTSIDE_V1


def given_keys(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a request sends: its Bearer token and its ``x-api-key`` (Claude Code sends either,
    as ANTHROPIC_AUTH_TOKEN or ANTHROPIC_API_KEY); empty values left out."""
    keys = []
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                keys.append(token.strip())
        elif name == b"x-api-key":
            keys.append(value.strip())
    return [key for key in keys if key]


class APIKeyMiddleware:
    """401 for guarded requests without the key (pure ASGI, so it runs before body parsing and
    never wraps a streaming response)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not needs_key(scope["path"]) or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = given_keys(scope.get("headers", ()))
        if not any(hmac.compare_digest(key, self._key) for key in given):
            state = scope["app"].state.localinfer  # a ServerState
            message = "missing API key" if not given else "invalid API key"
            state.metrics.count_error(401, "invalid_api_key")
            refusal = APIError(
                401,
                f"{message}: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await refusal.response(scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)
