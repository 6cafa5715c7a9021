"""The engine's view of the runner's KV slots: which request owns each, and what it caches.

A slot remembers the exact tokens whose KV the runner holds for it (``cached``). That list is the
hook for prefix reuse (``kv.placement`` chooses a new request's slot and the cells it reuses, and
only the rest is prefilled) and for speculative decoding (roll ``cached`` and the runner back
together with ``Runner.truncate``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.backends.base import Runner
    from localinfer.engine.sequence import Sequence as Seq

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Slot:
    index: int
    cached: list[int] = field(default_factory=list)  # tokens in the runner's KV, in order
    seq: Seq | None = None
    released_at_step: int = -1  # for least-recently-used choice among idle slots

    @property
    def busy(self) -> bool:
        return self.seq is not None


_SLICE = 64  # tokens compared at once: long matches run at C speed, a miss stops early


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + _SLICE, n)
        if tuple(a[i:j]) != tuple(b[i:j]):
            break
        i = j
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotTable:
    def __init__(self, n: int) -> None:
        self.slots = [Slot(i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.slots)

    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.seq is None]

    def busy(self) -> list[Slot]:
        return [s for s in self.slots if s.seq is not None]

    def cells_used(self) -> int:
        return sum(len(s.cached) for s in self.slots)


def cut_slot(runner: Runner, slot: Slot, keep: int) -> int:
    """Make the runner's slot hold exactly ``slot.cached[:keep]``; returns what it kept.

    A runner that cannot cut its cache there (a backend whose memory refuses partial removal)
    costs the reuse, never correctness: the slot is emptied and prefilled cold.
    """
    if len(slot.cached) > keep:
        try:
            runner.truncate(slot.index, keep)
        except Exception:  # noqa: BLE001 - fall back to a cold prefill of this slot
            log.exception("truncating slot %d to %d failed; releasing it", slot.index, keep)
            runner.release(slot.index)
            keep = 0
        del slot.cached[keep:]
    return keep


def empty_slot(runner: Runner, slot: Slot) -> None:
    """Drop the slot's whole cache, in the runner and in this view."""
    try:
        runner.release(slot.index)
    except Exception:  # noqa: BLE001 - the next admission truncates again anyway
        log.exception("releasing slot %d failed", slot.index)
    slot.cached.clear()
