"""On-disk cache of quantized weights, so a model is quantized once and later loads are fast.

An entry is a folder under ``cache_dir()/quant/`` holding one ``.npy`` per array and a
``manifest.json``. It is keyed by the model file (resolved path, size, modification time: a file
replaced in place gets a new key) and the method (e.g. ``torch-int4-g128-v1``), so a changed
quantizer bumps its version and never reads an old layout. Entries are written to a temporary
folder and renamed into place, so a crash never leaves a half-written entry that looks complete.
Arrays are loaded memory-mapped; the runner copies what it keeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from localinfer.paths import cache_dir

FORMAT = 1
DISABLE_ENV = "LOCALINFER_QUANT_CACHE"  # "0": quantize on every load, write nothing
Entry = dict[str, dict[str, np.ndarray]]  # tensor name -> array name -> array


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
        folder = self.entry_dir(model_path, method)
        manifest_path = folder / "manifest.json"
        if not manifest_path.is_file():
            return None
        try:
            manifest = json.loads(manifest_path.read_text())
            if manifest.get("format") != FORMAT or manifest.get("method") != method:
                return None
            entry: Entry = {}
            for name, files in manifest["tensors"].items():
                entry[name] = {
                    array: np.load(folder / file, mmap_mode="r", allow_pickle=False)
                    for array, file in files.items()
                }
            return entry
        except (OSError, ValueError, KeyError):
            # A damaged entry is rebuilt, not fatal: drop it.
            shutil.rmtree(folder, ignore_errors=True)
            return None

    def save(self, model_path: Path, method: str, entry: Entry) -> Path:
        """Write ``entry`` atomically; returns its folder."""
        folder = self.entry_dir(model_path, method)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
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
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return folder

    def nbytes(self, model_path: Path, method: str) -> int:
        folder = self.entry_dir(model_path, method)
        return sum(f.stat().st_size for f in folder.glob("*.npy")) if folder.is_dir() else 0
