"""The models one server holds: loaded at start or on demand, unloaded when another model needs
their memory (idle ones, least recently used first) or when idle past the keep-alive.

    pool = ModelPool(supply, PoolSettings(keep_alive_s=300))
    pool.start([supply.find("smollm2")])       # the start-up models, in a background thread
    lease = await pool.acquire("qwen3-0.6b")    # loads it if needed; 404 / 503 / 507 otherwise
    ... lease.session.engine ...                # the model stays loaded while the lease is held
    lease.release()

Loads and unloads run in their own threads; requests for other models go on meanwhile, and
requests for a loading model wait for that one load. A request holds a lease from lookup to the
end of its response, so a model never unloads under it. Every load decision is
``memory_plan.plan_load`` over the budget's figures.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from localinfer.errors import LocalinferError, OutOfMemoryBudgetError
from localinfer.server.errors import RETRY_AFTER_S, APIError
from localinfer.server.memory_plan import LoadPlan, plan_load
from localinfer.server.model_ids import check_model_id
from localinfer.server.pool_errors import load_failed, not_together, still_waiting
from localinfer.server.pool_model import (
    AVAILABLE,
    FINISHING,
    LOADED,
    LOADING,
    UNLOADING,
    ModelSource,
    ModelSupply,
    ModelView,
    PoolModel,
)
from localinfer.server.served_session import ServedSession
from localinfer.server.state_signal import StateSignal

log = logging.getLogger(__name__)

# An engine winding down a request its client left says so to no one: a load waiting only on
# that looks again this often. Every other change wakes the waiters (StateSignal).
FINISHING_RECHECK_S = 0.05
MAX_NAMES_SHOWN = 12  # in a 404's list of the models there are


@dataclass(frozen=True, slots=True)
class PoolSettings:
    keep_alive_s: float | None = 300.0  # models loaded on demand unload idle this long; None: never
    wait_s: float = 120.0  # how long a request waits for a load or for memory, then a 503


class Lease:
    """A request's hold on a loaded model; ``release`` (once) lets it unload again."""

    def __init__(self, pool: ModelPool, model: PoolModel, session: ServedSession) -> None:
        self._pool = pool
        self.model = model
        self.session = session
        self._released = False

    @property
    def id(self) -> str:
        return self.model.id

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self.model)


class ModelPool:
    def __init__(self, supply: ModelSupply, settings: PoolSettings | None = None) -> None:
        self.supply = supply
        self.settings = settings or PoolSettings()
        self._lock = threading.RLock()
        self._models: list[PoolModel] = []  # in the order they became known
        self._default: PoolModel | None = None
        self._closed = False
        self._stop = threading.Event()
        self._changes = StateSignal()  # notified on every change a waiting request awaits

    # -- what there is ---------------------------------------------------------------------

    @property
    def default(self) -> PoolModel | None:
        """The model a request without a known ``model`` field gets: the first named at start."""
        return self._default

    def views(self) -> list[ModelView]:
        with self._lock:
            return [m.view() for m in self._models]

    def view_of(self, session: ServedSession) -> ModelView | None:
        with self._lock:
            return next((m.view() for m in self._models if m.session is session), None)

    def add(self, source: ModelSource, *, resident: bool = False) -> PoolModel:
        """The model of ``source``, known from now on (once per key)."""
        with self._lock:
            for model in self._models:
                if model.source.key == source.key:
                    model.aliases |= source.aliases
                    model.resident |= resident
                    return model
            taken = {name for m in self._models for name in m.names()}
            wanted = source.id or "loading"
            model_id = wanted if wanted not in taken or wanted == "loading" else source.spec
            model = PoolModel(source, model_id, set(source.aliases) - {model_id}, resident=resident)
            self._models.append(model)
            if resident and self._default is None:
                self._default = model
            return model

    def add_loaded(self, source: ModelSource, session: ServedSession) -> PoolModel:
        """A session the caller opened and will close: served as it is, never unloaded."""
        model = self.add(source, resident=True)
        with self._lock:
            model.owned, model.need_known = False, True
            self._became_loaded(model, session)
        return model

    def find_known(self, name: str | None) -> PoolModel | None:
        with self._lock:
            if not name:
                return self._default
            return next((m for m in self._models if name in m.names()), None)

    def lookup(self, name: str | None) -> PoolModel:
        """The model ``name`` selects (the default one when empty); a 404 listing the models
        there are when none. Reads files: call off the event loop unless ``find_known`` hit."""
        known = self.find_known(name)
        if known is not None:
            return known
        if name:
            check_model_id(name)  # names first: only a plausible id reaches the supply's files
        source = self.supply.find(name) if name else None
        if source is None:
            raise self._not_found(name)
        model = self.add(source)
        with self._lock:
            model.aliases.add(name)  # type: ignore[arg-type]  # name is set: find() found it
        return model

    def listed(self) -> list[PoolModel]:
        """Every model known or loadable, each with its budget (reads files)."""
        for source in self.supply.listed():
            self.add(source)
        with self._lock:
            models = list(self._models)
        for model in models:
            try:
                self._know_need(model)
            except LocalinferError as exc:  # listed without a budget; a request says why
                log.warning("no budget for %s: %s", model.id, exc)
        return models

    def _not_found(self, name: str | None) -> APIError:
        try:
            names = [s.id or s.spec for s in self.supply.listed()]
        except LocalinferError:
            names = []
        with self._lock:
            names = list(dict.fromkeys([m.id for m in self._models] + names))
        shown = ", ".join(names[:MAX_NAMES_SHOWN])
        more = ""
        if len(names) > MAX_NAMES_SHOWN:
            more = f" and {len(names) - MAX_NAMES_SHOWN} more (GET /v1/models)"
        what = f"model '{name}' is not served here" if name else "no model is served yet"
        return APIError(
            404, f"{what}; available: {shown}{more}", code="model_not_found", param="model"
        )

    # -- using a model ---------------------------------------------------------------------

    async def acquire(self, name: str | None) -> Lease:
        """A lease on the loaded model ``name`` selects, loading it first when it is not."""
        model = self.find_known(name) or await run_in_threadpool(self.lookup, name)
        lease = await self._wait_loaded(model, take_lease=True)
        assert lease is not None
        return lease

    async def load(self, name: str) -> ModelView:
        """Load ``name`` (POST /v1/models/{id}/load): as a request would, without holding it."""
        model = self.find_known(name) or await run_in_threadpool(self.lookup, name)
        await self._wait_loaded(model, take_lease=False)
        return model.view()

    async def _wait_loaded(self, model: PoolModel, *, take_lease: bool) -> Lease | None:
        if not model.need_known:  # once per model: it reads the file's headers
            await run_in_threadpool(self._know_need, model)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.wait_s
        # The attempts already over when this request last looked: one that fails after it
        # (its own, or one another request started while this one was parked, however quickly
        # it failed) is this request's answer, never a reason to load again.
        settled: int | None = None
        blocked: str | None = None
        while True:
            with self._lock:
                seen, finishing = self._changes.version, False
                if self._closed:
                    raise APIError(503, "the server is shutting down", code="shutting_down")
                if model.state == LOADED:
                    assert model.session is not None
                    model.last_used = time.monotonic()
                    if not take_lease:
                        return None
                    model.leases += 1
                    return Lease(self, model, model.session)
                if model.state == AVAILABLE:
                    if settled is not None and model.failed_attempt > settled:
                        raise load_failed(model)
                    blocked = self._begin_load(model)
                    finishing = blocked is not None and self._finishing()
                if model.state == LOADING:
                    blocked = None
                settled = model.attempts - (model.state == LOADING)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise still_waiting(model, blocked)
            timeout = min(FINISHING_RECHECK_S, remaining) if finishing else remaining
            await self._changes.wait(seen, timeout)

    def _finishing(self) -> bool:
        """Whether a model is kept only by its engine's wind-down (under the lock)."""
        return any(m.kept_because() == FINISHING for m in self._models)

    def _release(self, model: PoolModel) -> None:
        with self._lock:
            model.leases -= 1
            model.last_used = time.monotonic()
            self._changes.notify()

    # -- loading and unloading -------------------------------------------------------------

    def _know_need(self, model: PoolModel) -> None:
        if model.need_known:
            return
        need = self.supply.need(model.source)  # reads the file's headers
        with self._lock:
            model.need, model.need_known = need, True

    def _begin_load(self, model: PoolModel) -> str | None:
        """Start loading ``model`` (under the lock), unloading what the plan says first; the
        reason it must wait instead, if it must. Raises 507 when it can never fit."""
        plan = self._plan(model)
        if plan.blocked:
            return plan.blocked
        victims = [m for m in self._models if m.id in plan.victims]
        for victim in victims:
            victim.state = UNLOADING
        model.state = LOADING
        model.attempts += 1
        name = f"localinfer-load-{model.id}"
        threading.Thread(target=self._load, args=(model, victims), name=name, daemon=True).start()
        return None

    def _plan(self, model: PoolModel) -> LoadPlan:
        if model.need is None:
            return LoadPlan()
        holders = [h for m in self._models if m is not model and (h := m.holder()) is not None]
        return plan_load(model.id, model.need, holders)

    def _load(self, model: PoolModel, victims: Sequence[PoolModel]) -> None:
        """In its own thread: unload ``victims``, then load ``model``. A failure is kept on the
        model for the requests waiting on this attempt."""
        for victim in victims:
            self._unload_now(victim, "memory")
        try:
            session = self.supply.open(model.source)
        except Exception as exc:  # noqa: BLE001 - handed to every request waiting on this load
            log.error("loading %s failed: %s", model.id, exc)
            with self._lock:
                model.state, model.failure = AVAILABLE, exc
                model.failed_attempt = model.attempts
                self._changes.notify()
            return
        with self._lock:
            if not self._closed:
                self._became_loaded(model, session)
                return
        session.close()  # the server stopped while it loaded

    def _became_loaded(self, model: PoolModel, session: ServedSession) -> None:
        loaded = session.model
        if model.source.id is None and model.id == "loading":
            taken = {name for m in self._models if m is not model for name in m.names()}
            model.id = loaded.name if loaded.name not in taken else str(loaded.path)
        model.aliases |= {loaded.name, loaded.path.name, loaded.path.stem} - {model.id}
        model.session, model.state, model.failure = session, LOADED, None
        model.loads += 1
        model.last_used = time.monotonic()
        self._changes.notify()
        log.info("model %s loaded", model.id)

    def _unload_now(self, model: PoolModel, reason: str) -> None:
        """Close ``model``'s session (marked UNLOADING by the caller, under the lock). The
        session is taken under the lock, so two unloads (shutdown beside keep-alive) never close
        it twice; a close that fails still leaves the model AVAILABLE, never stuck UNLOADING."""
        with self._lock:
            session, model.session = model.session, None
        try:
            if session is not None:
                session.close()
        except Exception:  # noqa: BLE001 - its memory may be lost; the pool must go on
            log.exception("closing model %s failed", model.id)
        with self._lock:
            model.state = AVAILABLE
            model.unloads[reason] += 1
            self._changes.notify()
        log.info("model %s unloaded (%s)", model.id, reason)

    def unload(self, name: str) -> ModelView:
        """Unload ``name`` now (POST /v1/models/{id}/unload); 409 while it serves requests, is
        pinned, or is loading. Blocking: closes the session."""
        model = self.lookup(name)
        with self._lock:
            if model.state == AVAILABLE:
                return model.view()
            why = model.kept_because()
            if why:
                retry = {"headers": {"Retry-After": str(RETRY_AFTER_S)}}
                raise APIError(
                    409,
                    f"model '{model.id}' is not unloaded: {why}",
                    code="model_in_use",
                    **(retry if why not in ("pinned", "handed in") else {}),  # type: ignore[arg-type]
                )
            model.state = UNLOADING
        self._unload_now(model, "request")
        return model.view()

    # -- start, keep-alive, close ----------------------------------------------------------

    def start(self, sources: Sequence[ModelSource], pins: Sequence[ModelSource] = ()) -> None:
        """Load ``sources`` in order (blocking: the server's start-up thread); the first is the
        default model. They must fit together: a refusal says what each needs."""
        for source in pins:
            self.add(source).pinned = True
        models = list(dict.fromkeys(self.add(source, resident=True) for source in sources))
        for model in models:  # (two names of one model load it once)
            self._know_need(model)
            with self._lock:
                plan = self._plan(model)
                if plan.blocked or plan.victims:
                    raise OutOfMemoryBudgetError(not_together(models))
                model.state = LOADING
                model.attempts += 1
            self._load(model, ())
            if model.failure is not None:
                raise model.failure
        if self.settings.keep_alive_s is not None:
            name = "localinfer-keep-alive"
            threading.Thread(target=self._keep_alive, name=name, daemon=True).start()

    def _keep_alive(self) -> None:
        ttl = self.settings.keep_alive_s
        assert ttl is not None
        while not self._stop.wait(max(0.05, min(1.0, ttl / 4))):
            now = time.monotonic()
            with self._lock:
                expired = [
                    m
                    for m in self._models
                    if m.state == LOADED and not m.resident and not m.kept_because()
                    and now - m.last_used >= ttl
                ]  # fmt: skip
                for model in expired:
                    model.state = UNLOADING
            for model in expired:
                self._unload_now(model, "keep_alive")

    def close(self) -> None:
        """Unload every model the pool opened (server shutdown)."""
        self._stop.set()
        with self._lock:
            self._closed = True
            self._changes.notify()
            owned = [m for m in self._models if m.owned and m.session is not None]
            for model in owned:
                model.state = UNLOADING
        for model in owned:
            self._unload_now(model, "shutdown")
