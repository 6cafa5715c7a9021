"""The model routes: what the server serves and explicit control over what is loaded.

    GET  /v1/models                  every model loaded, loading or loadable, with its state
    GET  /v1/models/{id}             one of them
    POST /v1/models/{id}/load        load it now (waits for the load, as a request would)
    POST /v1/models/{id}/unload      unload it now (409 while it serves requests or is pinned)

The list keeps OpenAI's shape (``{"object": "list", "data": [{"id", "object": "model", ...}]}``)
and adds each model's ``state`` and ``budget_bytes`` (the budget's total at the served slots x
ctx). Like every /v1 route they sit behind the API key.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from localinfer.server.model_ids import MAX_ID_CHARS, MODEL_ID_PATTERN
from localinfer.server.openapi_doc import error_responses
from localinfer.server.pool_model import ModelView
from localinfer.server.state import ServerState


class ModelIdConvertor(Convertor[str]):
    """The id at the end of GET /v1/models/{id}: any path (repo ids hold a slash) but one that
    ends in /load or /unload, which is those routes' (the id before them is a plain path).
    Without it GET /v1/models/{id} also matched /v1/models/X/load, and a wrong method there was
    a 405 that offered GET, not POST."""

    regex = r"(?!.*/(?:load|unload)$).+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("model_id", ModelIdConvertor())
ONE = "/v1/models/{model_id:model_id}"
ACTION = "/v1/models/{model_id:path}/"  # + load, unload
# The id as /openapi.json describes it; the pool applies the same rule (check_model_id), with a
# message that names the character at fault.
PathId = Annotated[
    str, Path(max_length=MAX_ID_CHARS, json_schema_extra={"pattern": MODEL_ID_PATTERN})
]


def add_model_routes(app: FastAPI, state: ServerState) -> None:
    """The routes above on ``app``."""

    @app.get("/v1/models", responses=error_responses("/v1/models", 503))
    async def list_models() -> dict[str, Any]:
        state.check_started()
        models = await run_in_threadpool(state.pool.listed)
        return {"object": "list", "data": [model_card(m.view()) for m in models]}

    @app.get(ONE, responses=error_responses(ONE, 400, 404, 503))
    async def get_model(model_id: PathId) -> dict[str, Any]:
        state.check_started()
        model = await run_in_threadpool(state.pool.lookup, model_id)
        return model_card(model.view())

    @app.post(ACTION + "load", responses=error_responses(ONE, 400, 404, 503, 507))
    async def load_model(model_id: PathId) -> dict[str, Any]:
        state.check_started()
        return model_card(await state.pool.load(model_id))

    @app.post(ACTION + "unload", responses=error_responses(ONE, 400, 404, 409, 503))
    async def unload_model(model_id: PathId) -> dict[str, Any]:
        state.check_started()
        return model_card(await run_in_threadpool(state.pool.unload, model_id))


def model_card(view: ModelView) -> dict[str, Any]:
    """OpenAI's model object, with the pool's fields beside its own."""
    card: dict[str, Any] = {
        "id": view.id,
        "object": "model",
        "created": 0,
        "owned_by": "localinfer",
        "state": view.state,
        "budget_bytes": view.budget_bytes,
        "device": view.device,
        "pinned": view.pinned,
        "in_flight": view.in_flight,
    }
    session = view.session
    if session is not None:
        engine = session.engine
        card["max_model_len"] = engine.max_ctx  # per request (per slot)
        card["meta"] = {"backend": engine.runner.info.backend, "slots": engine.runner.info.slots}
    if view.error is not None:
        card["error"] = view.error
    return card
