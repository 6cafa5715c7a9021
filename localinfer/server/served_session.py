"""What the server needs from a loaded model: ``localinfer.session.Session`` fits, and so does a
test's stand-in. Kept apart from ``state`` so the model pool can name it without a cycle."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from localinfer.constraints import ConstraintSpec
from localinfer.engine import ConstraintSource
from localinfer.engine.engine import Engine
from localinfer.loading.model import LoadedModel


class ServedSession(Protocol):
    """What the server needs from a session (localinfer.session.Session fits)."""

    model: LoadedModel
    engine: Engine

    def chat_prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> list[int]: ...

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> tuple[str, list[int]]: ...

    def compile_constraint(self, spec: ConstraintSpec) -> ConstraintSource: ...

    def raw_prompt_ids(self, text: str) -> list[int]: ...

    def close(self) -> None: ...


SessionLoader = Callable[[], ServedSession]


def engine_idle(session: ServedSession) -> bool:
    """No request running or queued on the session's engine (a client that left may still have
    its answer winding down after its HTTP request ended)."""
    m = session.engine.metrics()
    return m.slots_busy == 0 and m.queue_depth == 0
