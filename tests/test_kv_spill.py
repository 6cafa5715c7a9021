"""The RAM tier spills off the engine thread (spill_writer.SpillWriter): a slow disk never stalls a
step, a lookup racing a pending write still finds the entry, close() waits for every accepted
write, and a full queue drops its oldest spill with one log line.

The disk is a real DiskKVStore on a tmp folder whose first file write waits on a gate."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from localinfer.backends.base import KVSnapshot
from localinfer.engine.kv import spill_writer
from localinfer.engine.kv.disk_tier import DiskKVStore
from localinfer.engine.kv.ram_tier import RamKVStore
from localinfer.engine.kv.spill_writer import SpillWriter
from tests.prefix_reuse_helpers import seq
from tests.test_engine import reference_greedy
from tests.test_kv_tiers_engine import TransferHashRunner, run, source_of, tiers_engine

LAYOUT = TransferHashRunner().kv_cache.layout()
MODEL = "m" * 24 + "-spill"
GUARD_S = 60.0  # only so a broken build fails instead of hanging; nothing is timed


class GatedDisk(DiskKVStore):
    """The disk tier whose first file write waits until ``gate`` opens."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, MODEL, 1 << 30, layout=LAYOUT)
        self.gate = threading.Event()
        self.entered = threading.Event()  # the first write is waiting on the gate
        self.writer_threads: set[tuple[str, int]] = set()  # (name, ident) of each writer

    def _write(self, path: Path, header: bytes, payload: bytes) -> bool:
        self.writer_threads.add((threading.current_thread().name, threading.get_ident()))
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(GUARD_S)
        return super()._write(path, header, payload)


def on_disk(folder: Path) -> list[tuple[int, ...]]:
    """The keys a new process would find in ``folder``."""
    return DiskKVStore(folder, MODEL, 1 << 30, layout=LAYOUT).keys()


def finishes(fn: Callable[[], object]) -> bool:
    """Run ``fn`` in a thread; whether it returned (within the guard) rather than hung."""
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(GUARD_S)
    return not worker.is_alive()


def snap(n: int, nbytes: int = 64) -> KVSnapshot:
    return KVSnapshot(LAYOUT, n, bytes(i % 251 for i in range(nbytes)))


def test_a_step_never_waits_for_a_slow_disk_and_a_pending_spill_is_restored(
    tmp_path: Path,
) -> None:
    disk = GatedDisk(tmp_path)
    ram = RamKVStore(70 * 8, spill=disk)  # room for one conversation's cells
    runner, engine = tiers_engine(1, ram, disk)
    convs = [seq(50, i) for i in range(3)]
    got: list[tuple[list[int], tuple[int, str]]] = []
    again = convs[0] + seq(5, 9)

    def conversations() -> None:
        for c in convs:  # the third evicts the first from RAM: its spill waits on the gate
            run(engine, c, 4)
        assert disk.entered.wait(GUARD_S)
        tokens, reports = run(engine, again, 6)  # conv 0's cells: only in the pending spill
        got.append((tokens, source_of(reports)))

    try:
        assert finishes(conversations)  # the engine finished every request, gate still closed
        assert got == [(reference_greedy(again, 6), (50, "ram"))]
        assert ram.pending_spills() >= 1 and on_disk(tmp_path) == []
    finally:
        disk.gate.set()
    # One writer thread wrote every spill; the engine thread wrote nothing itself.
    assert [name for name, _ in disk.writer_threads] == ["kv-spill"]
    engine.flush_kv()  # drains, then writes what is left
    assert ram.pending_spills() == 0
    keys = on_disk(tmp_path)
    assert any(k[:50] == tuple(convs[0]) for k in keys)
    assert any(k[:50] == tuple(convs[1]) for k in keys)


def test_close_waits_for_pending_spills(tmp_path: Path) -> None:
    disk = GatedDisk(tmp_path)
    ram = RamKVStore(70 * 8, spill=disk)
    _, engine = tiers_engine(1, ram, disk)
    first = seq(50, 1)
    for c in (first, seq(50, 2), seq(50, 3)):
        run(engine, c, 4)
    assert disk.entered.wait(GUARD_S)  # the first conversation's spill is being written
    closer = threading.Thread(target=engine.close, daemon=True)
    try:
        closer.start()
        closer.join(0.5)
        assert closer.is_alive()  # close() cannot return while an accepted write is pending
    finally:
        disk.gate.set()
    closer.join(GUARD_S)
    assert not closer.is_alive()
    assert any(k[:50] == tuple(first) for k in on_disk(tmp_path))


def test_a_full_queue_drops_the_oldest_spill_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = GatedDisk(tmp_path)
    ram = RamKVStore(0, spill=disk, max_pending=2)  # every entry goes straight to the spill
    keys = [tuple(range(k * 10 + 1, k * 10 + 5)) for k in range(4)]
    try:
        ram.store(keys[0], snap(4))
        assert disk.entered.wait(GUARD_S)  # the writer holds keys[0]: the queue is empty
        for key in keys[1:]:
            ram.store(key, snap(4))  # the third of these overflows the queue of two
        dropped = [r for r in caplog.records if r.name == spill_writer.__name__]
        assert len(dropped) == 1 and "dropped the oldest (4 tokens" in dropped[0].getMessage()
        assert ram.pending_spills() == 3  # keys[0] being written, keys[2] and keys[3] queued
        assert ram.best_match(keys[1]) is None  # the dropped one is gone
        for key in (keys[0], keys[3]):  # pending entries are found and served from memory
            match = ram.best_match(list(key) + [99])
            assert match is not None and (match.tier, match.key, match.shared) == ("ram", key, 4)
            assert ram.load(key) == snap(4)
    finally:
        disk.gate.set()
    ram.drain()
    assert sorted(on_disk(tmp_path)) == [keys[0], keys[2], keys[3]]
    assert ram.load(keys[0]) == snap(4)  # written since: loaded from the spill tier
    assert len(ram) == 0 and ram.nbytes() == 0


def test_a_failed_write_is_logged_and_drain_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(DiskKVStore):
        def store(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
            raise OSError("disk gone")

    writer = SpillWriter(Broken(tmp_path, MODEL, 1 << 20, layout=LAYOUT))
    writer.submit((1, 2, 3), snap(3))
    assert finishes(writer.drain)
    assert writer.pending() == 0 and writer.get((1, 2, 3)) is None
    assert any("storing 3 tokens failed: disk gone" in r.getMessage() for r in caplog.records)
    writer.submit((4, 5), snap(2))  # the writer goes on after a failure
    assert finishes(writer.drain)
    with pytest.raises(ValueError):
        SpillWriter(Broken(tmp_path, MODEL, 1 << 20), max_pending=0)


def test_a_shorter_key_written_while_a_longer_one_lands_is_dropped(tmp_path: Path) -> None:
    """The spill thread writes a prefix while the engine thread stores a conversation that
    extends it: the longer entry holds those cells, so the prefix's file goes, never both."""
    disk = GatedDisk(tmp_path / "kv")
    short, long = seq(20, 3), seq(20, 3) + seq(10, 9)
    writer = threading.Thread(target=disk.store, args=(short, snap(len(short))))
    writer.start()
    assert disk.entered.wait(GUARD_S)  # the short write is held between write and index
    disk.store(long, snap(len(long)))
    disk.gate.set()
    writer.join(GUARD_S)
    assert on_disk(tmp_path / "kv") == [tuple(long)] == disk.keys()
    assert len(list((tmp_path / "kv").rglob("*.kv"))) == 1


def test_queued_spills_are_bounded_by_bytes_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind a slow disk, queued snapshots hold no more than ``max_pending_bytes`` besides the
    newest: a long context's snapshots cannot pile up host memory the budget never counted."""
    disk = GatedDisk(tmp_path)
    writer = SpillWriter(disk, max_pending=4, max_pending_bytes=250)  # two 100-byte entries
    keys = [tuple(range(k * 10 + 1, k * 10 + 5)) for k in range(5)]
    try:
        writer.submit(keys[0], snap(4, 100))
        assert disk.entered.wait(GUARD_S)  # keys[0] is being written: the queue is empty
        for key in keys[1:]:
            writer.submit(key, snap(4, 100))
        assert writer.pending() == 3  # keys[0] being written, keys[3] and keys[4] queued
        assert writer.get(keys[1]) is None and writer.get(keys[4]) == snap(4, 100)
        assert writer.dropped == 2
        assert len([r for r in caplog.records if r.name == spill_writer.__name__]) == 2
    finally:
        disk.gate.set()
    writer.drain()
    assert sorted(on_disk(tmp_path)) == [keys[0], keys[3], keys[4]]
