"""Limits on what a client can send, so a few bad clients cannot hold the server's memory or
connections: a body size, a deadline for the body, and (in ``protocol``) a head size and a
deadline for the head.

``BodyLimitMiddleware`` is the body half, in the app: a declared ``Content-Length`` over the
limit gets a 413 before anything is read; a chunked body is counted as it arrives; a body that
stops arriving gets a 408 once its deadline passes. The errors are OpenAI's JSON.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localinfer.server.errors import APIError, ErrorCounter, RefusingMiddleware

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may send. A 128k-token prompt is about 0.5 MiB of JSON, so the body
    limit leaves room for long contexts and tool definitions."""

    max_body_bytes: int = 8 * MIB
    max_header_bytes: int = 64 * KIB  # the request line and all headers together
    header_timeout_s: float = 10.0  # from the connection (or the last answer) to a whole head
    body_timeout_s: float = 30.0  # from the head to the whole body

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "header_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a body passes the limit (FastAPI re-raises HTTPExceptions
    met while reading a body, so this reaches the error handlers as a 413)."""

    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over the limit of {limit} bytes (the server's --max-body-size)",
        )


class BodyTimeout(HTTPException):
    code = "request_timeout"

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {seconds:g} s (the server's --body-timeout)",
            headers={"Connection": "close"},
        )


class BodyLimitMiddleware(RefusingMiddleware):
    """Pure ASGI: wraps ``receive`` while the body is arriving; after the body (a handler
    waiting for the client to disconnect) ``receive`` is left alone."""

    def __init__(
        self, app: ASGIApp, limits: RequestLimits, on_error: ErrorCounter | None = None
    ) -> None:
        super().__init__(app, on_error)
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            # Refused before reading; the server reads and drops the rest of the body.
            await self._refuse(BodyTooLarge(limit), scope, receive, send)
            return

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        received = 0
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.limits.body_timeout_s) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
                body_done = not message.get("more_body", False)
            else:
                body_done = True  # a disconnect
            return message

        started = False

        async def watch_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watch_send)
        except (BodyTooLarge, BodyTimeout) as error:
            # Raised where no error handler catches it (outside a FastAPI route's body read).
            if started:
                raise
            await self._refuse(error, scope, receive, send)

    async def _refuse(
        self, error: BodyTooLarge | BodyTimeout, scope: Scope, receive: Receive, send: Send
    ) -> None:
        refusal = APIError(
            error.status_code, str(error.detail), code=error.code, headers=error.headers
        )
        await self.refuse(refusal, scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP layer refuses a malformed length itself
    return None
