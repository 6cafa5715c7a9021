"""The records of the model pool: where a model comes from (``ModelSource``), what the pool
holds for it (``PoolModel``), what it shows (``ModelView``), and the ``ModelSupply`` that finds,
budgets and opens models (``model_loading.ServeSupply`` for `localinfer serve`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from localinfer.server.memory_plan import BudgetNeed, Holder
from localinfer.server.served_session import ServedSession, engine_idle

AVAILABLE, LOADING, LOADED, UNLOADING = "available", "loading", "loaded", "unloading"
FINISHING = "finishing a request"  # kept by its engine, which tells the pool of no change


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model the pool can load: found by the supply from a name a request or flag gave."""

    key: str  # what makes two names one model: the resolved file (and the quantization)
    id: str | None  # the id clients see; None: the session's model name once it is loaded
    spec: str  # what the supply opens
    aliases: frozenset[str] = frozenset()  # other names that select it


class ModelSupply(Protocol):
    """Finds, budgets and opens models; every method may read files (call off the event loop)."""

    def find(self, name: str) -> ModelSource | None:
        """The model ``name`` selects, if it is one this server may load; None if not."""
        ...

    def listed(self) -> list[ModelSource]:
        """The models this server may load on demand, for /v1/models."""
        ...

    def need(self, source: ModelSource) -> BudgetNeed | None:
        """Its budget at the served slots x ctx; None: not counted (a session handed in)."""
        ...

    def open(self, source: ModelSource) -> ServedSession:
        """Load it (seconds to minutes); raises LocalinferError when it cannot."""
        ...


@dataclass(eq=False, slots=True)
class PoolModel:
    """One model the pool knows, loaded or not. Mutated only under the pool's lock."""

    source: ModelSource
    id: str
    aliases: set[str]
    owned: bool = True  # False: a session handed to the server, never closed or unloaded by it
    pinned: bool = False  # --pin: never unloaded
    resident: bool = False  # named at start: keep-alive leaves it loaded
    state: str = AVAILABLE
    session: ServedSession | None = None
    need: BudgetNeed | None = None
    need_known: bool = False
    leases: int = 0  # requests holding it (from lookup to the end of the response)
    last_used: float = 0.0  # monotonic seconds of the last lease taken or given back
    attempts: int = 0  # loads started
    failed_attempt: int = 0  # the attempt ``failure`` ended
    failure: Exception | None = None
    loads: int = 0
    unloads: Counter[str] = field(default_factory=Counter)  # by reason: memory, keep_alive, ...

    def names(self) -> set[str]:
        return {self.id, *self.aliases}

    def kept_because(self) -> str:
        """Why it may not be unloaded now ("" when it may)."""
        if self.pinned:
            return "pinned"
        if not self.owned:
            return "handed in"
        if self.state != LOADED:
            return self.state
        if self.leases:
            return f"{self.leases} request{'s' if self.leases > 1 else ''} in flight"
        if self.session is not None and not engine_idle(self.session):
            return FINISHING
        return ""

    def holder(self) -> Holder | None:
        """Its claim on memory while it holds some (None: it holds none, or is not counted)."""
        if self.need is None or self.state == AVAILABLE:
            return None
        return Holder(self.id, self.need, self.last_used, self.kept_because())

    def view(self) -> ModelView:
        slots = ctx = None
        if self.session is not None:
            slots, ctx = self.session.engine.runner.info.slots, self.session.engine.max_ctx
        return ModelView(
            id=self.id,
            state=self.state,
            budget_bytes=self.need.bytes if self.need is not None else None,
            device=self.need.device if self.need is not None else None,
            pinned=self.pinned,
            resident=self.resident,
            in_flight=self.leases,
            slots=slots,
            ctx=ctx,
            loads=self.loads,
            unloads=dict(self.unloads),
            error=str(self.failure) if self.failure is not None else None,
            session=self.session,
        )


@dataclass(frozen=True, slots=True)
class ModelView:
    """A model as /v1/models, /health and /metrics show it."""

    id: str
    state: str  # available | loading | loaded | unloading
    budget_bytes: int | None  # the budget's total at the served slots x ctx (None: not counted)
    device: str | None  # the memory it counts against
    pinned: bool
    resident: bool  # named at start
    in_flight: int
    slots: int | None  # once loaded
    ctx: int | None
    loads: int
    unloads: dict[str, int]
    error: str | None  # why its last load failed
    session: ServedSession | None = field(default=None, repr=False)
