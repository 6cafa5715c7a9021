"""/openapi.json as the server behaves: every status a route answers, with the error body it
sends (``error_bodies``), and nothing it never sends.

Routes declare the statuses their own handling returns (``error_responses``: a 404 for a model
not served, a 503 while it loads...). ``install_openapi`` adds those that come from the layers
around every route, as the app was built: the body limits (413, 408) on routes that read a body,
the Host/Origin guard (403) unless it is off, and the API key (401, with its security schemes)
on /v1 when one is set. FastAPI's 422 goes: this server answers a body that fails validation
with a 400 (``errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from localinfer.server.auth import needs_key
from localinfer.server.error_bodies import AnthropicErrorBody, OpenAIErrorBody
from localinfer.server.errors import speaks_anthropic

DESCRIPTIONS = {
    400: "The request is malformed, or asks for what this server does not do",
    401: "The API key is missing or wrong",
    403: "The Host or Origin is not one this server answers",
    # A model that cannot do what the route asks: capability.py.
    404: "No model of that id is served here, or that model cannot do what is asked (a chat of "
    "a base model, fill-in-the-middle without FIM tokens, embeddings it cannot give, a rerank "
    "on a runner without rank pooling)",
    408: "The request body did not arrive in time",
    409: "The model is in use and was not unloaded",
    413: "The request body is over the size limit",
    503: "Busy (every slot and queue place taken), or the model is still loading",
    507: "The model does not fit in the memory this server may use",
}
# What a JSON answer, a streamed answer and a Prometheus scrape are sent as.
JSON, EVENT_STREAM, PROMETHEUS = "application/json", "text/event-stream", "text/plain"
# One server-sent event: "data: {json chunk}" (the last one "data: [DONE]" on OpenAI's routes),
# with an "event: name" line on Anthropic's and the Responses API's.
SSE_EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}
STREAMED = {"content": {EVENT_STREAM: {"schema": SSE_EVENT}}}
SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}
_DROPPED = ("HTTPValidationError", "ValidationError")  # FastAPI's 422 body, never sent


def error_model(path: str) -> type[BaseModel]:
    """The error body of the route at ``path``."""
    return AnthropicErrorBody if speaks_anthropic(path) else OpenAIErrorBody


def error_responses(path: str, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI's ``responses=`` for a route at ``path`` that answers ``statuses`` with errors."""
    model = error_model(path)
    return {status: {"model": model, "description": DESCRIPTIONS[status]} for status in statuses}


def install_openapi(app: FastAPI, *, api_key: bool, host_guard: bool) -> None:
    """Make ``app.openapi`` (and so /openapi.json) build the document described above."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            amend(build(), api_key=api_key, host_guard=host_guard)  # FastAPI keeps what it built
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def amend(schema: dict[str, Any], *, api_key: bool, host_guard: bool) -> None:
    """FastAPI's document, made to say what the layers around the routes answer."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in _DROPPED:
        schemas.pop(name, None)
    if api_key:
        components["securitySchemes"] = SCHEMES
    for path, operations in schema.get("paths", {}).items():
        model = error_model(path)
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        schemas.setdefault(model.__name__, model.model_json_schema(ref_template=_REF))
        _add_defs(schemas, model)
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            added = [403] if host_guard else []
            if method == "post":
                added += [408, 413]
            if api_key and needs_key(path):
                added.append(401)
                operation["security"] = [{name: []} for name in SCHEMES]
            for status in added:
                responses.setdefault(str(status), _error(status, ref))


_REF = "#/components/schemas/{model}"


def _error(status: int, ref: dict[str, str]) -> dict[str, Any]:
    return {"description": DESCRIPTIONS[status], "content": {JSON: {"schema": ref}}}


def _add_defs(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    """The models ``model`` nests, as components (pydantic puts them under $defs)."""
    own = schemas[model.__name__]
    for name, definition in own.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
