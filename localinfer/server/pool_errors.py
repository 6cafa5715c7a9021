"""The model pool's refusals: a load that failed, a wait that ran out, start-up models that do
not fit together."""

from __future__ import annotations

from collections.abc import Sequence

from localinfer.budget.memory import human_bytes
from localinfer.errors import LocalinferError
from localinfer.server.errors import RETRY_AFTER_S, APIError, from_localinfer_error
from localinfer.server.pool_model import PoolModel


def load_failed(model: PoolModel) -> APIError:
    """The failure of the load a request waited on, as the request's answer."""
    failure = model.failure
    if isinstance(failure, LocalinferError):
        return from_localinfer_error(failure)
    return APIError(500, f"loading model '{model.id}' failed: {failure}", code="model_error")


def still_waiting(model: PoolModel, blocked: str | None) -> APIError:
    """A 503 for a request that waited its --load-wait out (``blocked``: what held memory)."""
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    if blocked:
        message = f"model '{model.id}' cannot load yet: {blocked}; retry when they finish"
        return APIError(503, message, code="memory_in_use", headers=retry)
    message = f"model '{model.id}' is still loading; retry shortly"
    return APIError(503, message, code="model_loading", headers=retry)


def not_together(models: Sequence[PoolModel]) -> str:
    """Why the models named at start cannot all load: what each needs, and the memory."""
    parts = [f"{m.id} {human_bytes(m.need.bytes)}" for m in models if m.need is not None]
    cap = next((m.need for m in models if m.need is not None), None)
    room = f" in the {human_bytes(cap.capacity)} of {cap.device}" if cap else ""
    return f"the models named at start do not fit together{room}: {', '.join(parts)}"
