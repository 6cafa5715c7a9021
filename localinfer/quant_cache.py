"""On-disk cache of quantized weights, so a model is quantized once and later loads are fast.

An entry is a folder under ``cache_dir()/quant/`` holding one ``.npy`` per array and a
``manifest.json``. It is keyed by the model file (resolved path, size, modification time: a file
replaced in place gets a new key) and the method (e.g. ``torch-int4-g128-v1``), so a changed
quantizer bumps its version and never reads an old layout. Entries are written to a temporary
folder and renamed into place, so a crash never leaves a half-written entry that looks complete.
Arrays are loaded memory-mapped; the runner copies what it keeps.

Several processes may quantize the same model at once (two `serve`s, a chat and a bench): each
writes its own temporary folder, and when two publish one key the later rename fails on the
earlier one's folder; the later writer then uses that entry, which holds the same arrays. A
temporary folder carries its writer's pid, so one a killed writer left is swept on a later use
and one a live writer is filling is left alone (localinfer/stale_files.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.paths import cache_dir
from localinfer.stale_files import LeftoverSweep, writer_tag

FORMAT = 1
DISABLE_ENV = "LOCALINFER_QUANT_CACHE"  # "0": quantize on every load, write nothing
Entry = dict[str, dict[str, np.ndarray]]  # tensor name -> array name -> array
# Temporary folders: ".tmp-<writer pid>-<random>" (before pids: ".tmp-<random>").
_TEMP_RE = re.compile(r"\.tmp-(?:(?P<pid>\d+)-)?[A-Za-z0-9_]+")
# A live writer adds a file every few seconds; a temporary untouched this long has no writer.
STALE_TEMP_S = 3600.0
# rename() onto a folder that exists and is not empty.
_TAKEN = (errno.ENOTEMPTY, errno.EEXIST)


class DamagedEntry(ValueError):
    """A cache entry whose manifest is not what this module writes."""


def quant_cache_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def source_fingerprint(model_path: Path) -> dict[str, object]:
    """What identifies a model file's contents cheaply (no hashing of gigabytes)."""
    path = Path(model_path).resolve()
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class QuantCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir() / "quant"
        self._leftovers = LeftoverSweep(self.root, _TEMP_RE, STALE_TEMP_S)

    def key(self, model_path: Path, method: str) -> str:
        ident = json.dumps(
            {"source": source_fingerprint(model_path), "method": method, "format": FORMAT},
            sort_keys=True,
        )
        return hashlib.sha256(ident.encode()).hexdigest()[:24]

    def entry_dir(self, model_path: Path, method: str) -> Path:
        return self.root / self.key(model_path, method)

    def load(self, model_path: Path, method: str) -> Entry | None:
        """The cached arrays (memory-mapped), or None when absent or unreadable."""
        self._leftovers.once()
        folder = self.entry_dir(model_path, method)
        manifest_path = folder / "manifest.json"
        if not manifest_path.is_file():
            return None
        try:
            manifest = json.loads(manifest_path.read_text())
            tensors = _manifest_tensors(manifest)
            if manifest.get("format") != FORMAT or manifest.get("method") != method:
                return None
            entry: Entry = {}
            for name, files in tensors.items():
                entry[name] = {
                    array: np.load(folder / file, mmap_mode="r", allow_pickle=False)
                    for array, file in files.items()
                }
            return entry
        except (OSError, ValueError, RecursionError):
            # A damaged entry is rebuilt, not fatal: drop it.
            shutil.rmtree(folder, ignore_errors=True)
            return None

    def save(self, model_path: Path, method: str, entry: Entry) -> Path:
        """Write ``entry`` atomically; returns its folder."""
        folder = self.entry_dir(model_path, method)
        self.root.mkdir(parents=True, exist_ok=True)
        self._leftovers.once()
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{writer_tag()}-", dir=self.root))
        try:
            tensors: dict[str, dict[str, str]] = {}
            for i, (name, arrays) in enumerate(entry.items()):
                tensors[name] = {}
                for array, value in arrays.items():
                    file = f"{i:05d}-{array}.npy"
                    np.save(tmp / file, np.ascontiguousarray(value), allow_pickle=False)
                    tensors[name][array] = file
            manifest = {
                "format": FORMAT,
                "method": method,
                "source": source_fingerprint(model_path),
                "tensors": tensors,
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
            self._publish(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return folder

    def _publish(self, tmp: Path, folder: Path) -> None:
        """Rename the finished ``tmp`` to ``folder``, replacing an older entry there. When a
        concurrent writer publishes the same key first, its entry stays and ``tmp`` is dropped:
        same key, same source, same arrays."""
        try:
            os.rename(tmp, folder)
            return
        except OSError as exc:
            if exc.errno not in _TAKEN:
                raise
        # An entry is there already: move it aside (readers keep their open maps of it), then
        # publish. Another writer may publish between the two renames; then theirs is used.
        aside = self.root / f".tmp-{writer_tag()}-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(FileNotFoundError):  # another writer moved it aside first
            os.rename(folder, aside)
        try:
            os.rename(tmp, folder)
        except OSError as exc:
            if exc.errno not in _TAKEN:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        finally:
            shutil.rmtree(aside, ignore_errors=True)

    def remove_stale_temps(self) -> list[Path]:
        """Delete temporary folders whose writer was killed (or that nobody touched for an hour)."""
        return self._leftovers.run()

    def nbytes(self, model_path: Path, method: str) -> int:
        folder = self.entry_dir(model_path, method)
        return sum(f.stat().st_size for f in folder.glob("*.npy")) if folder.is_dir() else 0


def _manifest_tensors(manifest: Any) -> dict[str, dict[str, str]]:
    """The manifest's tensor -> array -> file table, checked for shape: a manifest written by
    something else (``[]``, ``"tensors": null``, a file outside the folder) is damaged."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tensors"), dict):
        raise DamagedEntry("manifest without a tensor table")
    tensors = manifest["tensors"]
    for name, files in tensors.items():
        if not isinstance(files, dict):
            raise DamagedEntry(f"tensor {name!r} has no file table")
        for file in files.values():
            if not isinstance(file, str) or Path(file).name != file or file.startswith("."):
                raise DamagedEntry(f"tensor {name!r} names a bad file {file!r}")
    return tensors
