"""Routes for probes and scrapers: ``/health`` (start-up state and slot use) and ``/metrics``
(Prometheus text, labelled by model). Neither needs the API key."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from localinfer.server.openapi_doc import PROMETHEUS
from localinfer.server.prometheus import ModelSample
from localinfer.server.state import ServerState


class ModelHealth(BaseModel):
    id: str
    state: str
    in_flight: int


class Health(BaseModel):
    """/health's body: the status alone while loading, with ``error`` once loading failed."""

    status: Literal["ok", "loading", "error"]
    error: str | None = None
    model: str | None = None
    slots_total: int | None = None
    slots_busy: int | None = None
    queue_depth: int | None = None
    models: list[ModelHealth] | None = None


HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Health},
    503: {"model": Health, "description": "The start-up models are still loading"},
    500: {"model": Health, "description": "The start-up models failed to load"},
}
# Prometheus' text format, version 0.0.4: what every scraper reads.
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {PROMETHEUS: {"schema": {"type": "string"}}}}
}


def add_ops_routes(app: FastAPI, state: ServerState) -> None:
    """``GET /health`` and ``GET /metrics`` on ``app``."""

    @app.get("/health", responses=HEALTH_RESPONSES)
    async def health() -> JSONResponse:
        """ "loading" (503) until the start-up models are in, "error" (500) when they failed,
        else "ok": slot figures summed over the loaded models, and each model's state."""
        if state.load_error is not None:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
        if state.starting:
            return JSONResponse({"status": "loading"}, status_code=503)
        totals = {"slots_total": 0, "slots_busy": 0, "queue_depth": 0}
        models: list[dict[str, Any]] = []
        for view in state.pool.views():
            models.append({"id": view.id, "state": view.state, "in_flight": view.in_flight})
            if view.session is not None:
                m = view.session.engine.metrics()
                totals["slots_total"] += m.slots_total
                totals["slots_busy"] += m.slots_busy
                totals["queue_depth"] += m.queue_depth
        body = {"status": "ok", "model": state.served_name, **totals, "models": models}
        return JSONResponse(body)

    @app.get("/metrics", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
    async def metrics() -> PlainTextResponse:
        samples = [
            ModelSample(
                view.id,
                view.state,
                view.session.engine.metrics() if view.session is not None else None,
                view.budget_bytes,
                view.in_flight,
                view.loads,
                view.unloads,
            )
            for view in state.pool.views()
        ]
        return PlainTextResponse(
            state.metrics.render_models(samples),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )
