"""The disk KV tier (issue #24): snapshots that outlive the process, one file per entry.

Files live under ``directory/<model_key>/`` (the session makes the key from the model's content
hash and the runner's KV layout, so models and dtypes never share a folder) in the format of
``disk_file.py``. They are untrusted input: a file that is short, damaged, of another version, or
written for another model or layout is removed with one log line and never used; nothing here
raises to the engine for a bad file or a failed write (the tier is a cache: losing an entry costs
a prefill, never a request).

Writes are atomic: a temporary in the same folder, fsync, then os.replace, so a reader sees a whole
file or none, without a lock held (lookups never wait for a write in progress, which the RAM tier
makes from its spill thread); the temporary carries the writer's pid, and one a killed writer left
is swept on the store's first use (localinfer/stale_files.py). The index of keys is built lazily
from the headers alone; files this process writes update it, files other processes write meanwhile
are seen by the next process. The folder is kept within ``cap_bytes`` of files, least recently
used out first (recency is the file's mtime, refreshed on every load).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localinfer.backends.base import KVSnapshot
from localinfer.engine.kv.disk_file import BadKVFile, encode_header, read_header, read_payload
from localinfer.engine.kv.store import TierMatch
from localinfer.stale_files import LeftoverSweep, writer_tag

log = logging.getLogger(__name__)

SUFFIX = ".kv"
_TEMP_RE = re.compile(r"\.tmp-(?P<pid>\d+)-[0-9a-f]+\.kvtmp")
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
STALE_TEMP_S = 3600.0  # a live writer finishes a file in seconds


@dataclass(slots=True)
class _Entry:
    path: Path
    tokens: np.ndarray  # [n] int64: the key
    file_bytes: int
    payload_bytes: int
    used: float  # when last stored or loaded (seconds since the epoch)


def entry_name(key: Sequence[int]) -> str:
    """The file name of ``key``'s entry: the same key always lands on the same file."""
    raw = np.asarray(key, dtype=np.int64).astype("<u4").tobytes()
    return hashlib.sha256(raw).hexdigest()[:40] + SUFFIX


class DiskKVStore:
    """A KVStore of files under ``directory/model_key``, within ``cap_bytes`` on disk.

    ``layout``, when given, is the only snapshot layout this store holds (the runner's
    ``kv_cache.layout()``): a file of another layout is dropped, storing another is a ValueError."""

    name = "disk"

    def __init__(
        self, directory: Path, model_key: str, cap_bytes: int, *, layout: str | None = None
    ) -> None:
        if not _KEY_RE.fullmatch(model_key):
            raise ValueError(f"model key {model_key!r} is not a plain folder name")
        if cap_bytes < 1:
            raise ValueError(f"disk tier cap must be positive, got {cap_bytes}")
        self.folder = Path(directory) / model_key
        self.model_key = model_key
        self.cap_bytes = cap_bytes
        self.layout = layout
        self._index: dict[tuple[int, ...], _Entry] | None = None
        self._lock = threading.Lock()  # the index: engine and spill threads store, a UI reads sizes
        self._leftovers = LeftoverSweep(self.folder, _TEMP_RE, STALE_TEMP_S)

    # -- KVStore ------------------------------------------------------------------------------

    def best_match(self, prompt_ids: Sequence[int]) -> TierMatch | None:
        """Over the index (headers only): the entry sharing the most leading tokens."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        if prompt.size == 0:
            return None
        best: tuple[int, float, tuple[int, ...]] | None = None
        with self._lock:
            for key, entry in self._entries().items():
                shared = _shared(entry.tokens, prompt)
                if shared and (best is None or (shared, entry.used) > best[:2]):
                    best = (shared, entry.used, key)
        return None if best is None else TierMatch(self.name, best[2], best[0])

    def load(self, key: tuple[int, ...]) -> KVSnapshot | None:
        with self._lock:
            index = self._entries()
            entry = index.get(tuple(key))
            if entry is None:
                return None
            try:
                snapshot = self._read(entry, tuple(key))
            except FileNotFoundError:  # another process's eviction: gone, not damaged
                del index[tuple(key)]
                return None
            except (BadKVFile, OSError) as exc:
                self._drop(entry.path, str(exc))
                del index[tuple(key)]
                return None
            entry.used = time.time()
            _touch(entry)
            return snapshot

    def store(self, key: tuple[int, ...], snapshot: KVSnapshot) -> None:
        """Write ``snapshot`` under ``key`` unless an entry already holds these cells (the same
        key, or one that extends it: that entry is refreshed instead, as the RAM tier does)."""
        key = tuple(int(t) for t in key)
        if snapshot.n_tokens != len(key):
            raise ValueError(f"snapshot of {snapshot.n_tokens} tokens stored under {len(key)}")
        if self.layout is not None and snapshot.layout != self.layout:
            raise ValueError(f"snapshot layout {snapshot.layout!r} is not this tier's")
        with self._lock:
            covering = _covering(self._entries(), key)
            if covering is not None and covering.path.exists():
                # These cells are on disk already (a flush after a flush, a conversation
                # persisted again): refresh the entry, before hashing a payload for nothing.
                covering.used = time.time()
                _touch(covering)
                return
        tokens = np.asarray(key, dtype=np.int64)
        header = encode_header(self.model_key, snapshot.layout, tokens, snapshot.payload)
        size = len(header) + snapshot.nbytes
        if size > self.cap_bytes:
            log.debug("kv disk tier: %d-token snapshot (%d bytes) exceeds the cap", len(key), size)
            return
        path = self.folder / entry_name(key)
        # Written outside the lock: lookups and loads (the engine thread) never wait for a write
        # (the RAM tier's spill thread); the file appears whole or not at all (os.replace).
        if not self._write(path, header, snapshot.payload):
            return
        with self._lock:
            index = self._entries()
            longer = next((k for k in index if len(k) > len(key) and k[: len(key)] == key), None)
            if longer is not None:  # written meanwhile by another thread: it holds these cells
                self._remove(path)
                return
            index[key] = entry = _Entry(path, tokens, size, snapshot.nbytes, time.time())
            _touch(entry)
            for other in [k for k in index if len(k) < len(key) and key[: len(k)] == k]:
                self._remove(index.pop(other).path)  # superseded by the longer entry
            self._evict(index, keep=key)

    def nbytes(self) -> int:
        """Payload bytes the tier holds (headers add a few bytes per token on disk)."""
        with self._lock:
            return sum(e.payload_bytes for e in self._entries().values())

    # -- for display and tests ----------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries())

    def file_bytes(self) -> int:
        """Bytes of the tier's files on disk (what ``cap_bytes`` bounds)."""
        with self._lock:
            return sum(e.file_bytes for e in self._entries().values())

    def keys(self) -> list[tuple[int, ...]]:
        with self._lock:
            return list(self._entries())

    # -- inside -------------------------------------------------------------------------------

    def _entries(self) -> dict[tuple[int, ...], _Entry]:
        """The index, read from the folder's headers on first use (caller holds the lock)."""
        if self._index is not None:
            return self._index
        self._index = {}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("kv disk tier: cannot use %s (%s); nothing is kept", self.folder, exc)
            return self._index
        self._leftovers.once()
        for path in sorted(self.folder.glob("*" + SUFFIX)):
            entry = self._index_entry(path)
            if entry is not None:
                self._index[entry[0]] = entry[1]
        self._evict(self._index, keep=None)  # the cap may be lower than the last run's
        return self._index

    def _index_entry(self, path: Path) -> tuple[tuple[int, ...], _Entry] | None:
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                header = read_header(f, st.st_size, self.cap_bytes)
            self._check_identity(header.model_key, header.layout)
            if path.name != entry_name(header.tokens):
                raise BadKVFile("file name does not match its tokens")
        except FileNotFoundError:
            return None
        except (BadKVFile, OSError) as exc:
            self._drop(path, str(exc))
            return None
        entry = _Entry(path, header.tokens, st.st_size, header.payload_len, st.st_mtime)
        return header.key, entry

    def _check_identity(self, model_key: str, layout: str) -> None:
        if model_key != self.model_key:
            raise BadKVFile(f"written for model key {model_key[:24]}")
        if self.layout is not None and layout != self.layout:
            raise BadKVFile(f"layout {layout!r} differs from this runner's")

    def _read(self, entry: _Entry, key: tuple[int, ...]) -> KVSnapshot:
        with entry.path.open("rb") as f:
            header = read_header(f, os.fstat(f.fileno()).st_size, self.cap_bytes)
            self._check_identity(header.model_key, header.layout)
            if header.key != key:  # replaced under our feet by a file of another key
                raise BadKVFile("tokens differ from the index")
            payload = read_payload(f, header)
        return KVSnapshot(header.layout, len(key), payload)

    def _write(self, path: Path, header: bytes, payload: bytes) -> bool:
        """Atomically write ``path``; False (with one log line) when the disk refuses."""
        tmp = self.folder / f".tmp-{writer_tag()}-{uuid.uuid4().hex[:12]}.kvtmp"
        try:
            with tmp.open("xb") as f:
                f.write(header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("kv disk tier: could not write %s (%s)", path.name, exc)
            self._remove(tmp)
            return False
        except BaseException:
            self._remove(tmp)
            raise
        _sync_folder(self.folder)
        return True

    def _evict(self, index: dict[tuple[int, ...], _Entry], keep: tuple[int, ...] | None) -> None:
        total = sum(e.file_bytes for e in index.values())
        for key in sorted(index, key=lambda k: index[k].used):
            if total <= self.cap_bytes:
                break
            if key == keep:
                continue
            entry = index.pop(key)
            total -= entry.file_bytes
            self._remove(entry.path)

    def _drop(self, path: Path, reason: str) -> None:
        log.warning("kv disk tier: ignored %s (%s); removed it", path.name, reason)
        self._remove(path)

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()


def _covering(index: dict[tuple[int, ...], _Entry], key: tuple[int, ...]) -> _Entry | None:
    """An entry whose key starts with ``key`` (``key`` itself included)."""
    if key in index:
        return index[key]
    n = len(key)
    return next((e for k, e in index.items() if len(k) > n and k[:n] == key), None)


def _shared(key: np.ndarray, prompt: np.ndarray) -> int:
    """Leading tokens ``key`` and ``prompt`` have in common."""
    n = min(key.size, prompt.size)
    if n == 0 or key[0] != prompt[0]:
        return 0
    differ = np.flatnonzero(key[:n] != prompt[:n])
    return int(differ[0]) if differ.size else n


def _touch(entry: _Entry) -> None:
    """The file's mtime is its recency for the next process that indexes the folder."""
    with contextlib.suppress(OSError):
        os.utime(entry.path, (entry.used, entry.used))


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); best effort elsewhere."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
