"""The disk KV tier (localinfer/engine/kv/disk_tier.py, disk_file.py) and the model hash it is
keyed by: files round-trip, are written atomically, are found by their headers alone, stay within
their cap (least recently used out first), supersede their prefixes, and a damaged, foreign or
hostile file is dropped with one log line, never used and never raised to the caller."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from localinfer import model_hash
from localinfer.backends.base import KVSnapshot
from localinfer.engine.kv import disk_file, disk_tier
from localinfer.engine.kv.disk_tier import DiskKVStore, entry_name
from localinfer.engine.kv.store import KVStore

LAYOUT = "torch|float32|layers=2|kv_heads=2|head_dim=4"
KEY = "a" * 24 + "-layout1"


def snap(n: int, fill: int = 7, layout: str = LAYOUT, size: int = 64) -> KVSnapshot:
    return KVSnapshot(layout, n, bytes((fill + i) % 256 for i in range(size * n)))


def store_at(root: Path, cap: int = 1 << 20, **kw: object) -> DiskKVStore:
    return DiskKVStore(root, KEY, cap, layout=kw.pop("layout", LAYOUT), **kw)  # type: ignore[arg-type]


def only_file(root: Path) -> Path:
    (path,) = (root / KEY).glob("*.kv")
    return path


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == disk_tier.__name__]


def test_a_snapshot_round_trips_through_a_new_process_view(tmp_path: Path) -> None:
    key = (5, 6, 7, 8)
    first = store_at(tmp_path)
    assert isinstance(first, KVStore)
    first.store(key, snap(4))
    again = store_at(tmp_path)  # a later process: the index comes from the folder
    assert again.keys() == [key] and len(again) == 1
    assert again.nbytes() == snap(4).nbytes
    match = again.best_match([5, 6, 7, 8, 9, 10])
    assert match is not None and (match.tier, match.key, match.shared) == ("disk", key, 4)
    assert again.load(key) == snap(4)
    assert again.load((1, 2)) is None


def test_best_match_reads_headers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = store_at(tmp_path)
    writer.store((1, 2, 3, 4), snap(4))
    writer.store((1, 2, 9), snap(3))
    writer.store((7, 8), snap(2))

    def no_payloads(*args: object) -> bytes:
        raise AssertionError("best_match read a payload")

    monkeypatch.setattr(disk_tier, "read_payload", no_payloads)
    reader = store_at(tmp_path)
    assert reader.best_match([1, 2, 3, 5]).key == (1, 2, 3, 4)  # type: ignore[union-attr]
    assert reader.best_match([1, 2, 3, 5]).shared == 3  # type: ignore[union-attr]
    assert reader.best_match([1, 2, 9, 9]).key == (1, 2, 9)  # type: ignore[union-attr]
    assert reader.best_match([7]).shared == 1  # type: ignore[union-attr]
    assert reader.best_match([3, 1, 2]) is None and reader.best_match([]) is None


def test_storing_a_key_supersedes_its_prefixes(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.store((1, 2, 3), snap(3))
    store.store((4, 5), snap(2))
    store.store((1, 2, 3, 4, 5), snap(5, fill=1))
    assert sorted(store.keys()) == [(1, 2, 3, 4, 5), (4, 5)]
    assert store.nbytes() == snap(5).nbytes + snap(2).nbytes
    assert sorted(p.name for p in (tmp_path / KEY).glob("*.kv")) == sorted(
        [entry_name((1, 2, 3, 4, 5)), entry_name((4, 5))]
    )
    assert store.load((1, 2, 3, 4, 5)) == snap(5, fill=1)
    # Cells already on disk are not written again: a prefix of an entry, or the same key.
    before = {p.name: p.stat().st_ino for p in (tmp_path / KEY).glob("*.kv")}
    store.store((1, 2), snap(2))
    store.store((1, 2, 3, 4, 5), snap(5, fill=9))
    assert {p.name: p.stat().st_ino for p in (tmp_path / KEY).glob("*.kv")} == before
    assert store.load((1, 2, 3, 4, 5)) == snap(5, fill=1)


def test_the_cap_evicts_the_least_recently_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(range(1_000_000, 2_000_000, 10))
    monkeypatch.setattr(disk_tier.time, "time", lambda: float(next(clock)))
    one_file = len(disk_file.encode_header(KEY, LAYOUT, disk_tier.np.arange(4), b"")) + 64 * 4
    store = store_at(tmp_path, cap=2 * one_file + 10)  # room for two 4-token entries
    store.store((1, 1, 1, 1), snap(4))
    store.store((2, 2, 2, 2), snap(4))
    assert store.load((1, 1, 1, 1)) is not None  # now (2, ...) is the least recently used
    store.store((3, 3, 3, 3), snap(4))
    assert sorted(store.keys()) == [(1, 1, 1, 1), (3, 3, 3, 3)]
    assert store.file_bytes() <= store.cap_bytes
    assert len(list((tmp_path / KEY).glob("*.kv"))) == 2
    # A later process sees the same recency (the load refreshed the file's mtime) ...
    store.load((1, 1, 1, 1))
    later = store_at(tmp_path, cap=2 * one_file + 10)
    later.store((4, 4, 4, 4), snap(4))
    assert sorted(later.keys()) == [(1, 1, 1, 1), (4, 4, 4, 4)]
    # ... and a smaller cap is enforced when it reads the folder.
    assert len(store_at(tmp_path, cap=one_file + 10)) == 1
    # A snapshot bigger than the whole cap is not kept at all.
    tiny = store_at(tmp_path / "tiny", cap=100)
    tiny.store((1, 2), snap(2))
    assert len(tiny) == 0 and not list((tmp_path / "tiny" / KEY).glob("*"))


def test_no_partial_file_is_ever_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_at(tmp_path)
    store.store((9,), snap(1))  # creates the folder and the index
    seen: list[list[str]] = []
    real_fsync = os.fsync

    def watching_fsync(fd: int) -> None:
        seen.append(sorted(p.name for p in (tmp_path / KEY).iterdir()))
        real_fsync(fd)

    monkeypatch.setattr(disk_tier.os, "fsync", watching_fsync)
    store.store((1, 2, 3), snap(3))
    # While the bytes were being written only the temporary existed beside the old entry.
    names = seen[0]
    assert entry_name((1, 2, 3)) not in names and any(n.endswith(".kvtmp") for n in names)
    assert sorted(p.name for p in (tmp_path / KEY).iterdir()) == sorted(
        [entry_name((9,)), entry_name((1, 2, 3))]
    )


def test_a_failed_or_interrupted_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_at(tmp_path)
    store.store((9,), snap(1))

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_tier.os, "fsync", full_disk)
    with caplog.at_level(logging.WARNING):
        store.store((1, 2, 3), snap(3))  # no exception: the tier is a cache
    assert len(warnings_of(caplog)) == 1 and "No space left" in warnings_of(caplog)[0]

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(disk_tier.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.store((4, 5), snap(2))
    assert [p.name for p in (tmp_path / KEY).iterdir()] == [entry_name((9,))]
    assert store.keys() == [(9,)]


CRASHING_WRITER = """
import os, sys
from pathlib import Path
from localinfer.backends.base import KVSnapshot
from localinfer.engine.kv import disk_tier
disk_tier.os.fsync = lambda fd: os._exit(3)  # the process dies between write and rename
store = disk_tier.DiskKVStore(Path(sys.argv[1]), sys.argv[2], 1 << 20)
store.store((1, 2, 3), KVSnapshot("x", 3, b"cells" * 100))
"""


def test_a_writer_killed_mid_write_leaves_only_a_temporary_that_is_swept(tmp_path: Path) -> None:
    crashed = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(tmp_path), KEY])
    assert crashed.returncode == 3
    folder = tmp_path / KEY
    (leftover,) = folder.iterdir()  # no entry: only the dead writer's temporary
    assert leftover.name.startswith(".tmp-") and leftover.stat().st_size > 0
    live = folder / f".tmp-{os.getpid()}-ba9876543210.kvtmp"  # a live writer's: left alone
    live.write_bytes(b"being written")
    store = store_at(tmp_path)
    assert store.best_match([1, 2, 3]) is None and len(store) == 0
    assert not leftover.exists() and live.exists()


def _flip(offset_from: str, delta: int = 0):  # type: ignore[no-untyped-def]
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        at = {"start": 0, "end": len(data) - 1}[offset_from] + delta
        data[at] ^= 0x40
        path.write_bytes(bytes(data))

    return damage


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def _rewrite_prefix(**fields: int) -> object:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        names = ("magic", "version", "reserved", "meta", "n", "payload")
        current = disk_file.PREFIX.unpack(bytes(data[: disk_file.PREFIX.size]))
        values = dict(zip(names, current, strict=True))
        values.update(fields)
        data[: disk_file.PREFIX.size] = disk_file.PREFIX.pack(*values.values())
        path.write_bytes(bytes(data))

    return damage


def _wrong_magic(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(b"GGUF\0\0\0\0" + data[8:])


DAMAGE = {
    "flipped payload byte": (_flip("end"), "payload checksum"),
    "flipped token byte": (_flip("start", disk_file.PREFIX.size + 120), "header checksum"),
    "truncated": (_truncate, "length"),
    "wrong magic": (_wrong_magic, "bad magic"),
    "other version": (_rewrite_prefix(version=99), "version 99"),
    "hostile token count": (_rewrite_prefix(n=2**32 - 1), "length"),
    "hostile payload length": (_rewrite_prefix(payload=2**63), "length"),
    "hostile meta length": (_rewrite_prefix(meta=2**31), "implausible"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_file_is_dropped_with_one_line(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = tuple(range(1, 41))
    store_at(tmp_path).store(key, snap(40))
    path = only_file(tmp_path)
    mutate, reason = DAMAGE[damage]
    mutate(path)  # type: ignore[operator]
    reader = store_at(tmp_path)
    tracemalloc.start()
    with caplog.at_level(logging.WARNING):
        found = reader.best_match(list(key))
        loaded = None if found is None else reader.load(found.key)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert loaded is None and reader.load(key) is None
    (line,) = warnings_of(caplog)
    assert reason in line and path.name in line
    assert not path.exists() and len(reader) == 0
    assert peak < 1 << 20  # a hostile length allocated nothing near what it claims


def test_a_file_of_another_layout_or_model_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store_at(tmp_path).store((1, 2, 3), snap(3))
    with caplog.at_level(logging.WARNING):
        assert store_at(tmp_path, layout="torch|bfloat16|other").best_match([1, 2, 3]) is None
    (line,) = warnings_of(caplog)
    assert "layout" in line and not list((tmp_path / KEY).glob("*.kv"))

    caplog.clear()
    store_at(tmp_path).store((1, 2, 3), snap(3))
    other = tmp_path / ("b" * 24)
    other.mkdir()
    only_file(tmp_path).rename(other / entry_name((1, 2, 3)))  # a file copied between models
    with caplog.at_level(logging.WARNING):
        assert DiskKVStore(tmp_path, "b" * 24, 1 << 20).best_match([1, 2, 3]) is None
    (line,) = warnings_of(caplog)
    assert "model key" in line and not list(other.glob("*.kv"))


def test_a_file_replaced_after_indexing_is_checked_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_at(tmp_path)
    store.store((1, 2, 3), snap(3))
    _flip("end")(only_file(tmp_path))  # damaged after the index read its header
    with caplog.at_level(logging.WARNING):
        assert store.best_match([1, 2, 3]) is not None
        assert store.load((1, 2, 3)) is None
    assert len(warnings_of(caplog)) == 1 and len(store) == 0


def test_the_store_refuses_what_it_cannot_hold(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    with pytest.raises(ValueError, match="layout"):
        store.store((1, 2), snap(2, layout="mlx|float16"))
    with pytest.raises(ValueError, match="2 tokens stored under 3"):
        store.store((1, 2, 3), snap(2))
    with pytest.raises(ValueError, match="folder name"):
        DiskKVStore(tmp_path, "../escape", 1 << 20)
    with pytest.raises(ValueError, match="positive"):
        DiskKVStore(tmp_path, KEY, 0)


def test_the_model_hash_is_computed_once_per_file_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights v1" * 1000)
    first = model_hash.model_content_hash(model)
    import hashlib

    assert first == hashlib.sha256(model.read_bytes()).hexdigest()
    real = model_hash._hash_model
    calls: list[Path] = []

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(model_hash, "_hash_model", counting)
    assert model_hash.model_content_hash(model) == first and calls == []
    model.write_bytes(b"weights v2" * 1000)
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = model_hash.model_content_hash(model)
    assert second != first and len(calls) == 1
    # A folder model hashes its files with their names: renaming one changes the hash.
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    before = model_hash.model_content_hash(folder)
    (folder / "model.safetensors").rename(folder / "model-00001.safetensors")
    assert model_hash.model_content_hash(folder) != before
