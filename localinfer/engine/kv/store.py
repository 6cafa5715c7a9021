"""The KV tiers below the slots (issue #24): where a slot's cells go when the slot is reused, and
where a new request may find its prompt's beginning already computed.

A tier holds :class:`~localinfer.backends.base.KVSnapshot` s keyed by the exact tokens whose cells
they are. The scheduler asks every tier for its longest match with a prompt, restores the best
(``KVTransfer.restore``, then truncates to the shared length) and prefills only the rest. The RAM
tier (``ram_tier.py``) is a bounded LRU in host memory; the disk tier (``disk_tier.py``) persists
across processes. Tiers never see a framework: a snapshot's payload is opaque bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from localinfer.backends.base import KVSnapshot


@dataclass(slots=True, frozen=True)
class TierMatch:
    """A tier's best entry for a prompt: the entry's key and how many leading tokens it shares."""

    tier: str
    key: tuple[int, ...]  # the entry's tokens (its snapshot holds exactly these cells)
    shared: int  # leading tokens the prompt and the entry have in common


@runtime_checkable
class KVStore(Protocol):
    """One tier. Called only from the engine thread, except where a method says otherwise."""

    name: str  # "ram" | "disk": shown in metrics and the step report

    def best_match(self, prompt_ids: Sequence[int]) -> TierMatch | None:
        """The entry sharing the most leading tokens with ``prompt_ids`` (None when none shares
        any). Cheap: no payload is read."""
        ...

    def load(self, key: tuple[int, ...]) -> KVSnapshot | None:
        """The entry's snapshot, or None when it is gone or unusable (a corrupt or mismatched file
        is dropped with one log line, never returned)."""
        ...

    def store(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
        """Keep ``snapshot`` (``snapshot.n_tokens == len(key)``) under ``key``; an entry that is a
        prefix of ``key`` is superseded. May evict others to stay within the tier's bound. A tier
        that a RAM tier spills into is also stored into from that tier's spill thread, while the
        engine thread looks up and loads: it must be thread-safe."""
        ...

    def nbytes(self) -> int:
        """Bytes the tier holds now (payloads)."""
        ...
