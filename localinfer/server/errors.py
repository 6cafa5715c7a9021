"""Every failure leaves the server as error JSON with the right status: OpenAI's shape,

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": "..."}}

or, on Anthropic's routes (/v1/messages...), Anthropic's shape (its SDK reads only this one):

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

The shape is chosen by the request's path, so one ``APIError`` serves both APIs. FastAPI answers
schema violations with 422 and its own shape; clients expect 400 and the shapes above, so the
handlers here replace FastAPI's. A bug in this server becomes a 500 in the same shape (and a log
line), never a dropped connection.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from localinfer.errors import (
    ContextOverflowError,
    InvalidParameterError,
    LocalinferError,
    QueueFullError,
)
from localinfer.server.error_bodies import (
    AnthropicErrorBody,
    AnthropicErrorDetail,
    OpenAIErrorBody,
    OpenAIErrorDetail,
)
from localinfer.server.json_response import SafeJSONResponse

log = logging.getLogger(__name__)

ErrorCounter = Callable[[int, str | None], None]  # (status, code) of each error response

# A message that starts with the request field it is about: "tools[0].function.name: ...".
FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]-]*): ")

# Seconds a client should wait before retrying when every slot and queue place is taken.
RETRY_AFTER_S = 1

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    503: "server_busy_error",
}

# Anthropic's error types (https://docs.anthropic.com/en/api/errors); 503 (every slot and queue
# place taken, or the model still loading) is what Anthropic calls overloaded.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ANTHROPIC_PATH = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    """Whether a request path is one of Anthropic's routes (its errors take Anthropic's shape)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


class APIError(Exception):
    """An error raised by the server's own request handling (not by the engine)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        anthropic_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.anthropic_message = anthropic_message or message  # where Anthropic words it apart
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, code=self.code, param=self.param)

    def anthropic_body(self) -> dict[str, Any]:
        return anthropic_error_body(self.status, self.anthropic_message)

    def response(self, path: str = "") -> JSONResponse:
        """The error for a request to ``path``: Anthropic's shape on its routes, else OpenAI's."""
        body = self.anthropic_body() if speaks_anthropic(path) else self.body()
        return SafeJSONResponse(body, status_code=self.status, headers=self.headers)


class RefusingMiddleware:
    """Base of the pure ASGI middlewares that may answer a request themselves, with an error;
    ``on_error(status, code)`` counts each refusal."""

    def __init__(self, app: ASGIApp, on_error: ErrorCounter | None = None) -> None:
        self.app = app
        self._on_error = on_error

    async def refuse(self, error: APIError, scope: Scope, receive: Receive, send: Send) -> None:
        if self._on_error is not None:
            self._on_error(error.status, error.code)
        await error.response(scope.get("path", ""))(scope, receive, send)


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    detail = OpenAIErrorDetail(message=message, type=kind, param=param, code=code)
    return OpenAIErrorBody(error=detail).model_dump()


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return AnthropicErrorBody(error=AnthropicErrorDetail(type=kind, message=message)).model_dump()


def unknown_route(request: Request) -> str:
    """A 404's message: what was asked, and every route this app serves."""
    served = [
        f"{method} {route.path_format}"
        for route in request.app.routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods - {"HEAD"})
    ]
    path = request.url.path
    asked = f"{request.method} {path}"
    return f"no route for {asked}; this server serves {', '.join(served)}"


def from_localinfer_error(exc: LocalinferError, param: str | None = None) -> APIError:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, QueueFullError) else None
    message, anthropic = str(exc), None
    if isinstance(exc, ContextOverflowError):
        # openai>=2 puts only the message in str(error), and LangChain's OpenAI client finds a
        # context overflow (to trim and retry) by the code's name in that string. Anthropic's
        # API words it "prompt is too long: N tokens > M maximum", which Claude Code acts on
        # (it compacts the conversation).
        anthropic = f"prompt is too long: {exc.requested} tokens > {exc.limit} maximum. {message}"
        message = f"{message} ({exc.code})"
    if param is None and isinstance(exc, InvalidParameterError):
        # "messages[2].tool_calls[0].function.arguments: not valid JSON" names its field.
        named = FIELD_PREFIX.match(message)
        param = named.group(1) if named else None
    return APIError(
        exc.http_status,
        message,
        code=exc.code,
        param=param,
        headers=headers,
        anthropic_message=anthropic,
    )


def _clean_loc(loc: tuple[Any, ...]) -> list[str]:
    """pydantic's location without where the value came from ("body", "path") and without
    union-member tags ("str", "list[TextPart]", "function-after[...]")."""
    out = []
    for at, part in enumerate(loc):
        text = str(part)
        # Only the first part says where (a body field may be called "query": /v1/rerank's).
        if (at == 0 and text in ("body", "path", "query")) or text in _TAGS or "[" in text:
            continue
        out.append(text)
    return out


# The role a message model is picked by, which pydantic puts after the message's index.
_ROLE_TAGS = {"system", "developer", "user", "assistant", "tool"}


def _path(loc: list[str]) -> str:
    """``messages[1].tool_calls[0].id``: the field as a client wrote it."""
    out = ""
    after_index = False
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
            after_index = True
            continue
        if not (after_index and part in _ROLE_TAGS):
            out += f".{part}" if out else part
        after_index = False
    return out


_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}

_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "lax-or-strict"}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A readable line from pydantic's error list, and the offending top-level field. A value
    that matches none of a union's forms yields one error per form; the first two are shown."""
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    if any(e.get("type") == "json_invalid" for e in errors):
        return "the request body is not valid JSON", None
    seen: list[str] = []
    param = None
    for err in errors:
        loc = _clean_loc(tuple(err.get("loc", ())))
        # A validator's own message ("Value error, ...") reads without pydantic's prefix; one
        # about the whole body names its field itself ("prompt: the prompt is empty").
        message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        named = None if loc else FIELD_PREFIX.match(message)
        path = _path(loc)
        param = param or (path if loc else named.group(1) if named else None)
        line = message if named else f"{path or 'body'}: {message}"
        if line not in seen:
            seen.append(line)
    more = f" (and {len(seen) - 2} more)" if len(seen) > 2 else ""
    return "; or ".join(seen[:2]) + more, param


def install_error_handlers(app: FastAPI, on_error: ErrorCounter | None = None) -> None:
    """Replace FastAPI's error responses; ``on_error(status, code)`` counts each one."""

    def respond(err: APIError, request: Request) -> JSONResponse:
        if on_error is not None:
            on_error(err.status, err.code)
        return err.response(request.url.path)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(exc, request)

    @app.exception_handler(LocalinferError)
    async def _localinfer_error(request: Request, exc: LocalinferError) -> JSONResponse:
        return respond(from_localinfer_error(exc), request)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return respond(APIError(400, message, code="invalid_request", param=param), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The request limits' exceptions carry their own code.
        # FastAPI's own 400 is a body it could not parse (nesting past the JSON parser's depth).
        code = getattr(exc, "code", None) or _HTTP_CODES.get(exc.status_code)
        # Only the router raises a bare 404 (an unknown model is an APIError).
        message = unknown_route(request) if exc.status_code == 404 else str(exc.detail)
        headers = getattr(exc, "headers", None)
        return respond(APIError(exc.status_code, message, code=code, headers=headers), request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving a request")
        message = f"internal server error: {type(exc).__name__}: {exc}"
        return respond(APIError(500, message, code="internal"), request)
