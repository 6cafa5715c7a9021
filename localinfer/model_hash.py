"""A model's content hash: what the disk KV tier (issue #24) keys its files by, so a cache written
for one model's weights is never restored into another's.

Hashing a 270 MB file takes about a second, a 5 GB one a minute: the digest is computed once and
remembered in a small side file (``cache_dir()/model_hashes.json``) under the file's resolved path,
size and modification time, so a later start that sees the same file reuses it. A file replaced
in place gets a new size or mtime and is hashed again. A Hugging Face folder is hashed as its
regular files in name order, each framed by its name and size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from localinfer.loading.gguf_split import gguf_part_paths
from localinfer.paths import cache_dir

SIDE_FILE = "model_hashes.json"
_CHUNK = 1 << 20
_MAX_REMEMBERED = 256  # side-file entries kept (oldest written first out)


def model_content_hash(path: Path) -> str:
    """sha256 (hex) of the model at ``path`` (a file, or a folder's files), cached by
    fingerprint."""
    path = Path(path).resolve()
    fingerprint = _fingerprint(path)
    remembered = _read_side_file()
    entry = remembered.get(str(path))
    if isinstance(entry, dict) and entry.get("fingerprint") == fingerprint:
        digest = entry.get("sha256")
        if isinstance(digest, str) and len(digest) == 64:
            return digest
    digest = _hash_model(path)
    remembered.pop(str(path), None)
    remembered[str(path)] = {"fingerprint": fingerprint, "sha256": digest}
    _write_side_file(dict(list(remembered.items())[-_MAX_REMEMBERED:]))
    return digest


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return gguf_part_paths(path)  # a split GGUF is all its parts; any other file is itself


def _fingerprint(path: Path) -> list[list[object]]:
    """What changes when the contents may have: each file's name, size and mtime."""
    out: list[list[object]] = []
    for file in _files(path):
        st = file.stat()
        out.append([file.name, st.st_size, st.st_mtime_ns])
    return out


def _hash_model(path: Path) -> str:
    digest = hashlib.sha256()
    folder = path.is_dir()
    for file in _files(path):
        if folder:  # a name and size frame each file, so moving bytes between files changes it
            digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _side_path() -> Path:
    return cache_dir() / SIDE_FILE


def _read_side_file() -> dict[str, object]:
    try:
        data = json.loads(_side_path().read_text())
    except (OSError, ValueError):  # absent or damaged: it is only a cache, hash again
        return {}
    return data if isinstance(data, dict) else {}


def _write_side_file(data: dict[str, object]) -> None:
    """Atomically (temp + rename): a concurrent reader sees the old file or the new one."""
    target = _side_path()
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".model_hashes-", suffix=".tmp")
    except OSError:
        return  # a read-only cache: the hash is recomputed next time, nothing worse
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
