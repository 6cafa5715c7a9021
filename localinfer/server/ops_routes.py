"""Routes for probes and scrapers: ``/health`` (load state and slot use) and ``/metrics``
(Prometheus text). Neither needs the API key."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from localinfer.server.state import ServerState


def add_ops_routes(app: FastAPI, state: ServerState) -> None:
    """``GET /health`` and ``GET /metrics`` on ``app``."""

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
