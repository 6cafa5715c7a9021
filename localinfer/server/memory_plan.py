"""Whether one more model fits beside the loaded ones, and which idle ones to unload for it.

Pure arithmetic over the budget's figures (``localinfer budget``'s total for each model at its
slots x ctx): the pool asks, then acts. A model never fits when it is larger than the memory, or
than what pinned models leave; it must wait when models serving requests (or loading) hold the
rest; otherwise idle models go, least recently used first, until it fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localinfer.budget.memory import human_bytes
from localinfer.errors import OutOfMemoryBudgetError


@dataclass(frozen=True, slots=True)
class BudgetNeed:
    """One model's claim on a memory, as the budget computes it."""

    device: str  # the memory it counts against: cpu, cuda:0, or the --device size
    bytes: int  # the budget's total: weights + KV cache at slots x ctx + compute + overhead
    capacity: int  # what that memory holds for models (--device SIZE, or free at start)
    summary: str = ""  # "smollm2-135m at 2048 ctx x 4 seq", for messages


@dataclass(frozen=True, slots=True)
class Holder:
    """A model holding memory now (loaded, loading or unloading)."""

    id: str
    need: BudgetNeed
    last_used: float  # monotonic seconds; the smallest goes first
    kept_because: str = ""  # "" when it may be unloaded; else "pinned", "2 requests in flight"

    @property
    def evictable(self) -> bool:
        return not self.kept_because

    @property
    def pinned(self) -> bool:
        return self.kept_because == "pinned"


@dataclass(frozen=True, slots=True)
class LoadPlan:
    victims: tuple[str, ...] = ()  # ids to unload first, least recently used first
    blocked: str | None = None  # why the load must wait; None: it may go now


def plan_load(model_id: str, need: BudgetNeed, holders: Sequence[Holder]) -> LoadPlan:
    """What loading ``model_id`` takes beside ``holders`` (those on other memories are ignored).

    Raises OutOfMemoryBudgetError, with the numbers, when waiting cannot help."""
    same = [h for h in holders if h.need.device == need.device and h.id != model_id]
    if need.bytes > need.capacity:
        raise OutOfMemoryBudgetError(
            f"{need.summary or model_id} needs {human_bytes(need.bytes)} but {need.device} holds "
            f"{human_bytes(need.capacity)} for models; serve it with a smaller --ctx or --slots"
        )
    pinned = [h for h in same if h.pinned]
    pinned_bytes = sum(h.need.bytes for h in pinned)
    if need.bytes > need.capacity - pinned_bytes:
        raise OutOfMemoryBudgetError(
            f"{need.summary or model_id} needs {human_bytes(need.bytes)}; of the "
            f"{human_bytes(need.capacity)} on {need.device}, pinned models hold "
            f"{human_bytes(pinned_bytes)} ({_list(pinned)}), leaving "
            f"{human_bytes(need.capacity - pinned_bytes)}"
        )
    free = need.capacity - sum(h.need.bytes for h in same)
    victims: list[str] = []
    for holder in sorted((h for h in same if h.evictable), key=lambda h: h.last_used):
        if need.bytes <= free:
            break
        victims.append(holder.id)
        free += holder.need.bytes
    if need.bytes <= free:
        return LoadPlan(tuple(victims))
    busy = [h for h in same if not h.evictable and not h.pinned]
    return LoadPlan(
        blocked=f"{need.summary or model_id} needs {human_bytes(need.bytes)} and "
        f"{human_bytes(free)} of {human_bytes(need.capacity)} on {need.device} can be freed now; "
        f"models in use hold the rest ({_list(busy)}) and are never unloaded under a request"
    )


def _list(holders: Sequence[Holder]) -> str:
    return ", ".join(f"{h.id}: {human_bytes(h.need.bytes)}, {h.kept_because}" for h in holders)
