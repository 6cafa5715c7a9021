"""The host-RAM KV tier (issue #24): slots' cells kept in host memory after the slot is reused.

A bounded LRU by payload bytes, keyed by the exact tokens a snapshot holds. Storing a key drops
the entries that are its prefix (the new one serves every prompt they served); storing a key that
an entry already extends only refreshes that entry. What the bound pushes out goes to ``spill``
(the disk tier) when there is one, and so does an entry too big to keep at all: written by a
background thread (``spill_writer.SpillWriter``), never on the engine thread. Until written, such
an entry is still found here and loaded from memory; ``spill_all`` and ``drain`` wait for every
write.

Lookups compare a prompt with each entry's key in slices, leaving an entry at the first slice
that differs, so a miss costs about one slice per entry however long the keys grow (a tier holds
tens of entries, not thousands: each is a whole conversation's cells).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from localinfer.backends.base import KVSnapshot
from localinfer.engine.kv.spill_writer import MAX_PENDING, PENDING_BYTES_FLOOR, SpillWriter
from localinfer.engine.kv.store import KVStore, TierMatch
from localinfer.engine.slots import shared_prefix

log = logging.getLogger(__name__)


class RamKVStore:
    """KVStore in host memory: at most ``capacity_bytes`` of payloads, least recently used out
    first (into ``spill`` when given, from a background thread: ``spill.store`` must be
    thread-safe; at most ``max_pending`` spills wait, the oldest is dropped beyond). Used from the
    engine thread only; ``nbytes`` and ``drain`` may be called from any thread."""

    name = "ram"

    def __init__(
        self, capacity_bytes: int, spill: KVStore | None = None, *, max_pending: int = MAX_PENDING
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.spill = spill
        pending_bytes = max(capacity_bytes, PENDING_BYTES_FLOOR)  # queued behind the disk
        writer = None if spill is None else SpillWriter(spill, max_pending, pending_bytes)
        self._writer = writer
        self._entries: OrderedDict[tuple[int, ...], KVSnapshot] = OrderedDict()  # LRU first
        self._bytes = 0
        self.evicted = 0  # entries pushed out by the bound (spilled or dropped)

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[int, ...]]:
        """The keys held, least recently used first."""
        return list(self._entries)

    def nbytes(self) -> int:
        return self._bytes

    def best_match(self, prompt_ids: Sequence[int]) -> TierMatch | None:
        """The best entry held here, or else on its way to the spill tier (still in memory)."""
        prompt = list(prompt_ids)
        best: TierMatch | None = None
        for key in self._entries:
            if not prompt or key[0] != prompt[0]:
                continue  # the common miss costs one comparison
            shared = shared_prefix(key, prompt)
            if best is None or shared > best.shared:
                best = TierMatch(self.name, key, shared)
        pending = self._writer.match(prompt, self.name) if self._writer is not None else None
        if pending is not None and (best is None or pending.shared > best.shared):
            return pending
        return best

    def load(self, key: tuple[int, ...]) -> KVSnapshot | None:
        snapshot = self._entries.get(key)
        if snapshot is not None:
            self._entries.move_to_end(key)
            return snapshot
        if self._writer is None or self.spill is None:
            return None
        # A spill ``best_match`` found pending: still queued, or written since.
        pending = self._writer.get(key)
        return pending if pending is not None else self.spill.load(key)

    def store(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
        if snapshot.n_tokens != len(key):
            raise ValueError(f"a snapshot of {snapshot.n_tokens} tokens stored under {len(key)}")
        covering = self._covering(key)
        if covering is not None:
            self._entries.move_to_end(covering)  # an entry already holds these cells and more
            return
        for old in [k for k in self._entries if len(k) < len(key) and key[: len(k)] == k]:
            self._bytes -= self._entries.pop(old).nbytes
        if snapshot.nbytes > self.capacity_bytes:
            self._spill(key, snapshot)  # bigger than the whole tier: never kept here
            return
        self._entries[key] = snapshot
        self._bytes += snapshot.nbytes
        while self._bytes > self.capacity_bytes:
            old, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self.evicted += 1
            self._spill(old, evicted)

    def spill_all(self) -> int:
        """Move every entry to the spill tier (process shutdown), on the caller's thread after the
        pending spills (none is dropped); returns how many moved. Without a spill tier the
        entries stay."""
        if self.spill is None:
            return 0
        self.drain()
        moved = 0
        while self._entries:
            key, snapshot = self._entries.popitem(last=False)
            self._bytes -= snapshot.nbytes
            moved += int(_store(self.spill, key, snapshot))
        return moved

    def drain(self) -> None:
        """Wait until every spill accepted so far is written to the spill tier."""
        if self._writer is not None:
            self._writer.drain()

    def pending_spills(self) -> int:
        """Evicted entries not yet written to the spill tier."""
        return self._writer.pending() if self._writer is not None else 0

    def _covering(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        """An entry whose key starts with ``key`` (equal included), if any."""
        n = len(key)
        for k in self._entries:
            if len(k) >= n and k[0] == key[0] and k[:n] == key:
                return k
        return None

    def _spill(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
        if self._writer is not None:
            self._writer.submit(key, snapshot)


def _store(store: KVStore, key: tuple[int, ...], snapshot: KVSnapshot) -> bool:
    try:
        store.store(key, snapshot)
    except Exception as exc:  # noqa: BLE001 - a full disk costs the entry, not the engine
        log.warning("kv tier %s: storing %d tokens failed: %s", store.name, len(key), exc)
        return False
    return True
