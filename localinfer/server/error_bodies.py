"""The error bodies the server sends, as pydantic models: ``errors`` builds every error response
from them and /openapi.json declares them (``openapi_doc``), so the document's error schema is
the body clients get.

    OpenAI's:     {"error": {"message", "type", "param", "code"}}
    Anthropic's:  {"type": "error", "error": {"type", "message"}}   (on /v1/messages...)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str  # invalid_request_error, not_found_error, server_busy_error, ...
    param: str | None  # the request field at fault, when one is
    code: str | None  # a stable machine-readable reason: model_not_found, server_busy, ...


class OpenAIErrorBody(BaseModel):
    """An error on every route but Anthropic's."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str  # invalid_request_error, not_found_error, overloaded_error, ...
    message: str


class AnthropicErrorBody(BaseModel):
    """An error on /v1/messages and /v1/messages/count_tokens (Anthropic's SDK reads only this)."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
