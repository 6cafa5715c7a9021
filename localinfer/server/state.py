"""What the running server holds: the session (once loaded), its names, and its own metrics.

``create_app`` takes either a ready session (tests, embedding) or a loader that runs in a
background thread after the server starts, so ``/health`` can answer "loading" meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from localinfer.constraints import ConstraintSpec
from localinfer.engine import ConstraintSource
from localinfer.engine.engine import Engine
from localinfer.loading.model import LoadedModel
from localinfer.server.errors import RETRY_AFTER_S, APIError
from localinfer.server.prometheus import ServerMetrics

log = logging.getLogger(__name__)


class ServedSession(Protocol):
    """What the server needs from a session (localinfer.session.Session fits)."""

    model: LoadedModel
    engine: Engine

    def chat_prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> list[int]: ...

    def compile_constraint(self, spec: ConstraintSpec) -> ConstraintSource: ...

    def raw_prompt_ids(self, text: str) -> list[int]: ...

    def close(self) -> None: ...


SessionLoader = Callable[[], ServedSession]


class ServerState:
    def __init__(
        self,
        session: ServedSession | None,
        *,
        served_name: str | None = None,
        aliases: Iterable[str] = (),
        owns_session: bool = False,
    ) -> None:
        self.metrics = ServerMetrics()
        self.load_error: str | None = None
        self.load_exception: Exception | None = None
        self.owns_session = owns_session
        self._served_name = served_name
        self._aliases = {a for a in aliases if a}
        self._lock = threading.Lock()
        self._session: ServedSession | None = None
        self._closed = False
        if session is not None:
            self._set(session)

    # -- lifecycle ---------------------------------------------------------------------------

    def load(self, loader: SessionLoader) -> None:
        """Run ``loader`` (in a background thread); failures are kept for /health to report."""
        try:
            session = loader()
        except Exception as exc:  # noqa: BLE001 - reported through /health and the serve command
            log.error("loading the model failed: %s", exc)
            self.load_error = str(exc) or type(exc).__name__
            self.load_exception = exc
            return
        with self._lock:
            if self._closed:  # the server stopped while the model was loading
                session.close()
                return
            self._set(session)
        log.info("model %s loaded; serving", self.served_name)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None and self.owns_session:
            session.close()

    def _set(self, session: ServedSession) -> None:
        model = session.model
        self._served_name = self._served_name or model.name
        self._aliases |= {model.name, model.path.name, model.path.stem}
        self._session = session

    # -- queries -----------------------------------------------------------------------------

    @property
    def session(self) -> ServedSession | None:
        return self._session

    @property
    def served_name(self) -> str:
        return self._served_name or "loading"

    def serves(self, name: str | None) -> bool:
        return not name or name == self._served_name or name in self._aliases

    def ready(self) -> ServedSession:
        """The session, or a 503 that says why there is none yet."""
        session = self._session
        if session is not None:
            return session
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", code="model_error")
        raise APIError(
            503,
            "the model is still loading; retry shortly",
            code="model_loading",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def check_model(self, name: str | None) -> None:
        if not self.serves(name):
            raise APIError(
                404,
                f"model '{name}' is not served here; this server serves '{self.served_name}'",
                code="model_not_found",
                param="model",
            )
