"""Optional API key: ``Authorization: Bearer KEY`` on /v1/* (health and metrics stay open for
probes and scrapers)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from localinfer.server.errors import APIError


class APIKeyMiddleware:
    """401 for /v1/* requests without ``Authorization: Bearer <key>`` (pure ASGI, so it runs
    before body parsing and never wraps a streaming response)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not (scope["path"] == "/v1" or scope["path"].startswith("/v1/"))
            or scope["method"] == "OPTIONS"
        ):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
        if not hmac.compare_digest(given, self._key):
            state = scope["app"].state.localinfer  # a ServerState
            message = "missing API key" if not given else "invalid API key"
            state.metrics.count_error(401, "invalid_api_key")
            refusal = APIError(
                401,
                f"{message}: send it as 'Authorization: Bearer KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
