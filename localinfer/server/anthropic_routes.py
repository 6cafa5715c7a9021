"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens (issue #21)."""

from __future__ import annotations

from fastapi import FastAPI

from localinfer.server.state import ServerState


def add_anthropic_routes(app: FastAPI, state: ServerState) -> None:
    """Register the routes on ``app`` (being built in this session)."""
