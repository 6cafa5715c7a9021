"""Where a new request's prompt finds its beginning already computed (issue #24), and the slot
it takes.

With prefix reuse, a request may start from:

* ``"slot"``: the cells its own (idle) slot already holds, cut to the shared prefix (free);
* ``"copy"``: the longest matching prefix held by any other slot, idle or busy, copied across
  (``KVTransfer.copy_prefix``: a memory copy instead of a prefill);
* a tier (``"ram"``, ``"disk"``): the best entry of a :class:`KVStore`, restored into the slot
  and cut to the shared length.

The largest reuse wins; ties go to the cheaper source, in that order. A copy or restore is only
worth it from :data:`MIN_TRANSFER` tokens: every chat template opens with the same few tokens,
so a smaller match would trigger a transfer on nearly every admission for less work than one
prefill chunk costs, and displace cached cells for it. A short prompt sent again whole (a retry,
a regenerated answer, a client repeating one request) is not that: it goes back to the slot that
holds it, or is copied or restored from wherever its cells are. Moving cells costs memory
bandwidth, a prefill costs a pass over the weights per token, and a few tokens of prefill on a
CPU cost tens of milliseconds (docs/measurements.md, "A short prompt sent again").

Which idle slot to take: the one with the most reuse; among those, one whose cells are not lost
(an empty slot, or one whose whole cache is the prompt's beginning), then one reusing its own
cells, then the least recently used. So conversations that share only a system prompt do not
evict each other: a new one takes an empty slot and copies the system prompt from where it is.
When they arrive together, the later ones wait until the first has prefilled it
(``place``). A slot's cells that a new request is about to drop go to the RAM tier first
(``_save``).

Any failed copy or restore costs the reuse, never the request: one log line, the slot emptied,
a cold prefill.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from localinfer.backends.base import KVSnapshot, Runner, kv_splicer, kv_transfer
from localinfer.engine.kv.chunk_reuse import plan_reuse, prepare_slot
from localinfer.engine.kv.ram_tier import RamKVStore
from localinfer.engine.kv.store import KVStore
from localinfer.engine.slots import Slot, SlotTable, empty_slot, shared_prefix

log = logging.getLogger(__name__)

MIN_TRANSFER = 16  # tokens: below this a copy or restore is not worth its cost (module doc)
SOURCES = ("slot", "copy")  # then the tiers, in the order given: the order ties are broken in


@dataclass(slots=True, frozen=True)
class Placement:
    """A new request's slot and where its reused cells come from."""

    slot: Slot
    reuse: int  # prompt tokens the slot will hold from a cache before prefilling the rest
    source: str  # "slot" | "copy" | a tier's name | "cold"
    rank: int = 0  # position in SOURCES + tiers (lower: cheaper)
    keep: int = 0  # "slot": the shared prefix kept in place (``reuse`` adds moved chunks)
    src_slot: int | None = None  # "copy": the slot copied from
    store: KVStore | None = None  # a tier: the tier and its entry's key
    key: tuple[int, ...] = ()


class SlotPlacer:
    """Chooses and prepares the slot of each new request (engine thread only)."""

    def __init__(
        self,
        runner: Runner,
        slots: SlotTable,
        stores: Sequence[KVStore] = (),
        *,
        prefix_reuse: bool,
        cache_reuse: int = 0,
        prefill_chunk: int = 256,
        min_transfer: int = MIN_TRANSFER,
    ) -> None:
        self.runner = runner
        self.slots = slots
        self.prefix_reuse = prefix_reuse
        self.cache_reuse = cache_reuse
        self.prefill_chunk = prefill_chunk
        self.min_transfer = max(1, min_transfer)
        # Copies and tiers need a KV cache that transfers cells (KVTransfer), and idle slots that
        # keep their cells; chunks moved into place need one that splices (KVSplicer).
        self.kv = kv_transfer(runner) if prefix_reuse else None
        self.transfer = self.kv is not None
        self.splices = kv_splicer(runner) is not None
        if stores and not self.transfer:
            why = "prefix reuse is off" if not prefix_reuse else "the runner cannot move its KV"
            log.info("KV tiers %s unused: %s", [s.name for s in stores], why)
        self.stores: tuple[KVStore, ...] = tuple(stores) if self.transfer else ()
        self.ram = next((s for s in self.stores if s.name == "ram"), None)
        self.copy = True  # copies between slots (scripts/bench-prefix turns it off to compare)
        self.failures = 0  # copies and restores that fell back to a cold prefill

    # -- choosing --------------------------------------------------------------------------

    def place(self, prompt: Sequence[int], limit: int) -> Placement | None:
        """The idle slot for ``prompt`` and its best source (``limit``: most tokens reusable), or
        None while it should stay queued (``_should_wait``). Asks the tiers once: their answer
        serves both questions. Reads only; raises RuntimeError when no slot is idle."""
        tier = self._best_tier(prompt, limit) if self.prefix_reuse else None
        if self._should_wait(prompt, limit, tier):
            return None
        return self._choose(prompt, limit, tier)

    def _should_wait(self, prompt: Sequence[int], limit: int, tier: Placement | None) -> bool:
        """Whether ``prompt`` should stay queued a few steps because a busy slot is still
        prefilling a long beginning it shares (conversations arriving together with one system
        prompt): once those cells exist they are copied, instead of prefilled once per slot. The
        wait costs little: the earlier request's prefill gets the step's prompt budget first
        anyway, so the later one would finish its own copy of that work no sooner."""
        if not (self.transfer and self.copy):
            return False
        coming = 0
        for slot in self.slots.busy():
            seq = slot.seq
            assert seq is not None
            if seq.num_output == 0:  # still prefilling: its prompt is where its cells are going
                soon = min(shared_prefix(seq.prompt_ids, prompt), limit)
                if soon > len(slot.cached):
                    coming = max(coming, soon)
        if coming < self.min_transfer:
            return False
        now = max(min(shared_prefix(s.cached, prompt), limit) for s in self.slots.slots)
        now = max(now, tier.reuse if tier is not None else 0)
        return coming > now

    def _choose(self, prompt: Sequence[int], limit: int, tier: Placement | None) -> Placement:
        """The idle slot for ``prompt`` and its best source; ``tier``: the tiers' best entry."""
        free = self.slots.free()
        if not free:
            raise RuntimeError("no idle slot")
        if not self.prefix_reuse:
            return Placement(min(free, key=lambda s: (s.released_at_step, s.index)), 0, "cold")
        held = {s.index: min(shared_prefix(s.cached, prompt), limit) for s in self.slots.slots}
        best: tuple[tuple[int, bool, bool, int, int], Placement] | None = None
        for slot in free:
            option = self._best_for(slot, held, tier, prompt, limit)
            kept = option.reuse if option.source == "slot" else 0
            keeps_all = len(slot.cached) <= kept
            # A few own tokens are not worth another conversation's cells (module doc), unless
            # they are the whole prompt (_worth).
            worth = keeps_all or self._worth(option.reuse, limit)
            score = option.reuse if worth else 0
            rank = (score, keeps_all, option.source == "slot", -slot.released_at_step, -slot.index)
            if best is None or rank > best[0]:
                best = (rank, option)
        assert best is not None
        return best[1]

    def _worth(self, reuse: int, limit: int) -> bool:
        """Whether reusing ``reuse`` tokens is worth a transfer or another conversation's cells:
        MIN_TRANSFER tokens, or the whole prompt (``limit``: a request sent again starts at its
        last token instead of prefilling; module doc)."""
        return reuse >= self.min_transfer or 0 < limit <= reuse

    def _best_for(
        self,
        slot: Slot,
        held: dict[int, int],
        tier: Placement | None,
        prompt: Sequence[int],
        limit: int,
    ) -> Placement:
        """``slot``'s best source: its own cells, a copy from another slot, or the best tier."""
        keep = held[slot.index]
        own = keep
        if self.cache_reuse and self.splices:  # chunks moved into place
            plan = plan_reuse(slot.cached, prompt, keep, self.cache_reuse, self.prefill_chunk)
            own = plan.reused
        options = [Placement(slot, own, "slot" if own else "cold", keep=keep)]
        if self.transfer:
            others = [s for s in self.slots.slots if s is not slot]
            src = max(others, key=lambda s: held[s.index], default=None)
            if self.copy and src is not None and self._worth(held[src.index], limit):
                options.append(Placement(slot, held[src.index], "copy", 1, src_slot=src.index))
            if tier is not None:
                options.append(dataclasses.replace(tier, slot=slot))
        return max(options, key=lambda o: (o.reuse, -o.rank))

    def _best_tier(self, prompt: Sequence[int], limit: int) -> Placement | None:
        """The tiers' best entry for ``prompt`` (slot left to fill), if worth a restore."""
        best: Placement | None = None
        for i, store in enumerate(self.stores):
            try:
                match = store.best_match(prompt)
            except Exception as exc:  # noqa: BLE001 - a broken tier costs its hits only
                log.warning("kv tier %s: lookup failed: %s", store.name, exc)
                continue
            if match is None:
                continue
            reuse = min(match.shared, limit)
            if self._worth(reuse, limit) and (best is None or reuse > best.reuse):
                rank = len(SOURCES) + i
                best = Placement(Slot(-1), reuse, store.name, rank, store=store, key=match.key)
        return best

    # -- preparing -------------------------------------------------------------------------

    def prepare(self, placement: Placement, prompt: Sequence[int]) -> tuple[int, str]:
        """Make the slot hold the start of ``prompt``; returns the tokens it reuses and their
        source ("cold" for none). Raises only when the runner cannot even empty the slot."""
        slot = placement.slot
        if placement.source in ("slot", "cold"):
            self._save(slot, placement.reuse)
            reuse = prepare_slot(
                self.runner, slot, prompt, placement.keep, self.cache_reuse, self.prefill_chunk
            )
            return reuse, "slot" if reuse else "cold"
        what = placement.source if placement.source == "copy" else f"{placement.source} restore"
        try:
            snapshot = self._fetch(placement)  # first: saving the slot may evict this entry
            self._save(slot, 0)
            self._transfer(placement, snapshot)
        except Exception as exc:  # noqa: BLE001 - fall back to a cold prefill (module doc)
            self.failures += 1
            if isinstance(exc, NotImplementedError):
                self.transfer, self.stores, self.ram = False, (), None  # never again this run
            log.warning(
                "slot %d: %s of %d tokens failed, prefilling cold: %s: %s",
                *(slot.index, what, placement.reuse, type(exc).__name__, exc),
            )
            empty_slot(self.runner, slot)
            return 0, "cold"
        slot.cached[:] = prompt[: placement.reuse]
        return placement.reuse, placement.source

    def _fetch(self, placement: Placement) -> KVSnapshot | None:
        """A tier's snapshot for ``placement`` (None for a copy); raises when it is gone."""
        if placement.store is None:
            return None
        snapshot = placement.store.load(placement.key)
        if snapshot is None:
            raise LookupError("the entry is gone or unusable")
        return snapshot

    def _transfer(self, placement: Placement, snapshot: KVSnapshot | None) -> None:
        kv, dst, n = self.kv, placement.slot.index, placement.reuse
        assert kv is not None
        if snapshot is None:
            assert placement.src_slot is not None
            kv.copy_prefix(placement.src_slot, dst, n)
        else:
            kv.restore(dst, snapshot)
            if snapshot.n_tokens > n:
                self.runner.truncate(dst, n)
        held = self.runner.slot_length(dst)
        if held != n:
            raise RuntimeError(f"the slot holds {held} cells, not {n}")

    def _save(self, slot: Slot, kept: int) -> None:
        """Snapshot the slot's cells into the RAM tier before a new request drops them beyond
        ``kept``: only when that drops at least MIN_TRANSFER tokens the tier lacks."""
        n = len(slot.cached)
        if self.ram is None or n - kept < self.min_transfer:
            return
        key = tuple(slot.cached)
        match = self.ram.best_match(key)
        if match is not None and match.shared == n:
            return  # the tier already holds these cells (this slot was restored from it)
        self._snapshot_into(slot, n, key, (self.ram,))

    def _snapshot_into(
        self, slot: Slot, n: int, key: tuple[int, ...], stores: Sequence[KVStore]
    ) -> bool:
        """Snapshot ``slot``'s first ``n`` cells into ``stores``; False when nothing was kept."""
        assert self.kv is not None
        try:
            snapshot = self.kv.snapshot(slot.index, n)
        except Exception as exc:  # noqa: BLE001 - the cells are lost, the request goes on
            log.warning("slot %d: snapshot of %d tokens failed: %s", slot.index, n, exc)
            return False
        return _store_all(stores, key, snapshot)

    # -- persisting (Engine.persist_prefix, Engine.flush_kv) -------------------------------

    def persist_prefix(self, tokens: Sequence[int]) -> int:
        """Store the longest cached prefix of ``tokens`` (from a slot, else from a tier) into
        every tier; returns its length (0: nothing cached, or no tiers)."""
        if not self.stores:
            return 0
        tokens = list(tokens)
        slot = max(self.slots.slots, key=lambda s: shared_prefix(s.cached, tokens))
        n = shared_prefix(slot.cached, tokens)
        best_tier: tuple[int, KVStore, tuple[int, ...]] | None = None
        for store in self.stores:
            match = store.best_match(tokens)
            # Only an entry lying wholly within ``tokens``: one that goes on is another
            # conversation sharing a beginning (a system prompt), not this one.
            if (
                match is not None
                and match.shared == len(match.key) > n
                and (best_tier is None or match.shared > best_tier[0])
            ):
                best_tier = (match.shared, store, match.key)
        if best_tier is not None:  # the slot was reused since: a tier holds the conversation
            shared, source, key = best_tier
            snapshot = source.load(key)
            others = [s for s in self.stores if s is not source]
            if snapshot is not None and _store_all(others, key, snapshot):
                return shared
        if n < 1:
            return 0
        key = tuple(tokens[:n])
        lacking = _lacking(self.stores, key)
        return n if not lacking or self._snapshot_into(slot, n, key, lacking) else 0

    def flush(self) -> int:
        """Shutdown: every slot's cells into the tiers that outlive the process, and the RAM
        tiers' entries, pending spills first, into their spill tiers; returns how many entries
        were written (pending spills not counted)."""
        rams = [s for s in self.stores if isinstance(s, RamKVStore)]
        for ram in rams:
            ram.drain()  # evictions being written: on disk first, so none is written twice
        written = 0
        lasting = [s for s in self.stores if not isinstance(s, RamKVStore)]
        for slot in self.slots.slots:
            key = tuple(slot.cached)
            lacking = _lacking(lasting, key)  # a second flush, or a persisted prefix: no rewrite
            if len(key) >= self.min_transfer and lacking:
                written += int(self._snapshot_into(slot, len(key), key, lacking))
        for ram in rams:
            written += ram.spill_all()
        return written


def _store_all(stores: Sequence[KVStore], key: tuple[int, ...], snapshot: KVSnapshot) -> bool:
    """Store one snapshot in each tier; True when at least one kept it."""
    kept = False
    for store in stores:
        try:
            store.store(key, snapshot)
            kept = True
        except Exception as exc:  # noqa: BLE001 - a full disk costs the entry, not the engine
            log.warning("kv tier %s: storing %d tokens failed: %s", store.name, len(key), exc)
    return kept


def _lacking(stores: Sequence[KVStore], key: tuple[int, ...]) -> list[KVStore]:
    """The tiers that do not already hold all of ``key``'s cells."""
    out = []
    for store in stores:
        match = store.best_match(key) if key else None
        if match is None or match.shared < len(key):
            out.append(store)
    return out
