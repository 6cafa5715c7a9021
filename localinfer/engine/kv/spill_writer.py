"""The RAM tier's spill writer (issue #24): entries the RAM tier evicts reach the disk tier from a
background thread, so a decode step never waits for a file write and its fsync.

One daemon thread per writer, started by the first spill and gone after ``IDLE_S`` without one
(starting a thread waits until it runs: a loaded machine's scheduling delay, paid once per burst
of spills rather than per spill; a spill otherwise costs the engine thread one notify). The queue
is bounded (``max_pending`` entries, besides the one being written): when it is full the oldest
pending spill is dropped with one log line rather than make the engine wait; a dropped entry
costs a prefill later, never a request. Until its write is done an entry stays readable here
(``match``, ``get``), so a lookup racing the write still finds it (the RAM tier serves it from
memory). ``drain`` waits until everything accepted is written (Engine.close reaches it through
SlotPlacer.flush).

Pending snapshots are host memory beyond the RAM tier's bound: at most ``max_pending + 1``
entries, and no more queued bytes than ``max_pending_bytes`` besides the newest (the RAM tier
passes the larger of its capacity and PENDING_BYTES_FLOOR): a long context's snapshots cannot
pile several GiB up behind a slow disk.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

from localinfer.backends.base import KVSnapshot
from localinfer.engine.kv.store import KVStore, TierMatch
from localinfer.engine.slots import shared_prefix

log = logging.getLogger(__name__)

MAX_PENDING = 4  # entries: a disk keeps up with evictions; this only absorbs a burst
PENDING_BYTES_FLOOR = 256 * 2**20  # a small RAM tier still queues a few spills behind a disk
IDLE_S = 60.0  # seconds an idle writer thread waits for the next spill before it ends


class SpillWriter:
    """Writes snapshots into ``target`` (whose ``store`` must be thread-safe) off the caller's
    thread. ``submit`` never blocks; every other method may be called from any thread."""

    def __init__(
        self, target: KVStore, max_pending: int = MAX_PENDING, max_pending_bytes: int | None = None
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.target = target
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes  # None: bounded by count alone
        self.dropped = 0  # spills dropped because the queue was full
        self._queue: OrderedDict[tuple[int, ...], KVSnapshot] = OrderedDict()  # oldest first
        self._writing: tuple[tuple[int, ...], KVSnapshot] | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()

    def submit(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
        """Queue ``snapshot`` for writing under ``key``; drops the oldest pending one if full."""
        with self._cond:
            self._queue.pop(key, None)  # the same cells again: written once, at the newest place
            self._queue[key] = snapshot
            while len(self._queue) > self.max_pending or self._over_bytes():
                old, evicted = self._queue.popitem(last=False)
                self.dropped += 1
                log.warning(
                    "kv tier %s: %d spills pending, dropped the oldest (%d tokens, %d bytes)",
                    *(self.target.name, len(self._queue) + 1, len(old), evicted.nbytes),
                )
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kv-spill", daemon=True)
                self._thread.start()

    def _over_bytes(self) -> bool:
        """More queued bytes than allowed, beyond the newest entry (which always waits)."""
        if self.max_pending_bytes is None or len(self._queue) < 2:
            return False
        return sum(s.nbytes for s in self._queue.values()) > self.max_pending_bytes

    def match(self, prompt: Sequence[int], tier: str) -> TierMatch | None:
        """The pending entry sharing the most leading tokens with ``prompt`` (as ``tier``'s: the
        tier that serves it from memory meanwhile)."""
        best: TierMatch | None = None
        for key in self._pending_keys():
            if not prompt or key[0] != prompt[0]:
                continue
            shared = shared_prefix(key, prompt)
            if best is None or shared > best.shared:
                best = TierMatch(tier, key, shared)
        return best

    def get(self, key: tuple[int, ...]) -> KVSnapshot | None:
        """The pending snapshot of ``key`` (None once written, dropped, or never submitted)."""
        with self._cond:
            if self._writing is not None and self._writing[0] == key:
                return self._writing[1]
            return self._queue.get(key)

    def pending(self) -> int:
        """Entries not yet written (the one being written included)."""
        with self._cond:
            return len(self._queue) + int(self._writing is not None)

    def drain(self) -> None:
        """Wait until every accepted spill is written (or has failed with its log line)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._writing is None and (not self._queue or self._thread is None)
            )

    def _pending_keys(self) -> list[tuple[int, ...]]:
        with self._cond:
            keys = list(self._queue)
            if self._writing is not None:
                keys.append(self._writing[0])
            return keys

    def _run(self) -> None:
        try:
            self._write_all()
        except BaseException:
            with self._cond:  # never leave drain waiting on a thread that is gone
                self._thread, self._writing = None, None
                self._cond.notify_all()
            raise

    def _write_all(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._queue, IDLE_S):
                    self._thread = None  # a later submit starts another
                    return
                self._writing = key, snapshot = self._queue.popitem(last=False)
            try:
                self.target.store(key, snapshot)
            except Exception as exc:  # noqa: BLE001 - a full disk costs the entry, not the engine
                log.warning(
                    "kv tier %s: storing %d tokens failed: %s", self.target.name, len(key), exc
                )
            finally:
                with self._cond:
                    self._writing = None  # readable here until now: the target has it from here
                    self._cond.notify_all()
