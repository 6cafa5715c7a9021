"""What the running server holds: its model pool, its own metrics, and how start-up went.

Routes ask ``session_for(request, model)`` for the session of the model a request names; the
lease that keeps that model loaded is given back by ``LeaseMiddleware`` when the response has
been sent (a stream's last byte included), so no model unloads under a request.

``create_app`` builds the pool from a ready session (tests, embedding: served as it is), from a
loader that runs in a background thread after the server starts (``/health`` answers "loading"
meanwhile), or takes the pool `localinfer serve` built (several models, loaded on demand).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from localinfer.context_fit import OverflowPolicy
from localinfer.engine import Engine
from localinfer.engine.arrivals import Arrivals
from localinfer.errors import LocalinferError
from localinfer.server.errors import RETRY_AFTER_S, APIError
from localinfer.server.image_fetch import ImageFetch
from localinfer.server.model_pool import Lease, ModelPool, PoolSettings
from localinfer.server.pool_model import ModelSource
from localinfer.server.prometheus import ServerMetrics
from localinfer.server.served_session import ServedSession, SessionLoader

__all__ = ["LeaseMiddleware", "ServedSession", "ServerState", "SessionLoader", "handed_pool"]

log = logging.getLogger(__name__)

LEASES = "localinfer.leases"  # the ASGI scope's key for the leases a request holds
StartUp = Callable[[ModelPool], None]  # loads the start-up models (a background thread)


class ServerState:
    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self.metrics = ServerMetrics()
        self.starting = False
        self.load_error: str | None = None
        self.load_exception: Exception | None = None
        # serve --context-overflow: a chat past the context refused (stop) or cut (overflow.py)
        self.context_overflow = OverflowPolicy.STOP
        # serve --allow-image-urls: how image URLs are fetched; None: they are refused
        self.image_fetch: ImageFetch | None = None
        # Requests being read: an idle engine waits for them to start together (engine/arrivals.py)
        self.arrivals = Arrivals()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, start_up: StartUp) -> None:
        """Run ``start_up`` (in a background thread); a failure is kept for /health and serve."""
        try:
            start_up(self.pool)
        except Exception as exc:  # noqa: BLE001 - reported through /health and the serve command
            log.error("loading the model failed: %s", exc)
            self.load_error = str(exc) or type(exc).__name__
            self.load_exception = exc
        finally:
            self.starting = False

    def close(self) -> None:
        self.pool.close()

    # -- queries -----------------------------------------------------------------------------

    @property
    def served_name(self) -> str:
        """The default model's id ("loading" until a loader names it)."""
        default = self.pool.default
        return default.id if default is not None else "loading"

    @property
    def session(self) -> ServedSession | None:
        """The default model's session while it is loaded."""
        default = self.pool.default
        return default.session if default is not None else None

    def check_started(self) -> None:
        """A 503 while the start-up models load, or after they failed to."""
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", code="model_error")
        if self.starting:
            raise APIError(
                503,
                "the model is still loading; retry shortly",
                code="model_loading",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    async def session_for(self, request: Request, name: str | None) -> ServedSession:
        """The session of the model ``name`` selects (the default one when empty), loaded on
        demand, held until ``request``'s response is sent."""
        self.check_started()
        lease = await self.pool.acquire(name)
        held = request.scope.get(LEASES)
        if held is None:  # not behind LeaseMiddleware: nothing would give it back
            lease.release()
            raise RuntimeError("session_for needs LeaseMiddleware around the app")
        held.append(lease)
        if isinstance(lease.session.engine, Engine):  # a remote engine has its own server
            lease.session.engine.arrivals = self.arrivals
        return lease.session

    def name_of(self, session: ServedSession) -> str:
        """The id clients see for the model ``session`` runs."""
        view = self.pool.view_of(session)
        return view.id if view is not None else self.served_name


class LeaseMiddleware:
    """Gives back the model leases a request took once its response is over (pure ASGI, so a
    streamed response counts until its last byte or its client leaving)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: list[Lease] = []
        scope[LEASES] = held
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in held:
                lease.release()


class _HandedSupply:
    """The supply of a server given one session (or one loader): nothing else is loadable."""

    def __init__(self, loader: SessionLoader | None = None) -> None:
        self._loader = loader

    def find(self, name: str) -> ModelSource | None:
        return None

    def listed(self) -> list[ModelSource]:
        return []

    def need(self, source: ModelSource) -> None:
        return None  # loaded by its caller's rules: not counted

    def open(self, source: ModelSource) -> ServedSession:
        if self._loader is None:
            raise LocalinferError("this server serves only the session it was given")
        return self._loader()


def handed_pool(
    session: ServedSession | None,
    loader: SessionLoader | None,
    served_name: str | None,
    aliases: Iterable[str],
) -> tuple[ModelPool, StartUp | None]:
    """The pool of one handed-in ``session`` (served as it is, closed by its owner), or of the
    one model ``loader`` opens at start (closed by the pool); and its start-up, if any."""
    source = ModelSource("handed", served_name, "", frozenset(a for a in aliases if a))
    pool = ModelPool(_HandedSupply(loader), PoolSettings(keep_alive_s=None))
    if session is not None:
        pool.add_loaded(source, session)
        return pool, None
    return pool, lambda p: p.start([source])
