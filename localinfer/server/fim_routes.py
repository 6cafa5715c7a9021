"""Fill-in-the-middle autocomplete: /v1/fim/completions (issue #21)."""

from __future__ import annotations

from fastapi import FastAPI

from localinfer.server.state import ServerState


def add_fim_routes(app: FastAPI, state: ServerState) -> None:
    """Register the routes on ``app`` (being built in this session)."""
