"""A model file memory-mapped for reading (GGUF, safetensors): tensors are arrays over the map,
so their bytes are read from disk only when touched."""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path
from typing import Self


class MappedFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mmap: mmap.mmap | None = None

    def _map(self) -> mmap.mmap:
        """Map the whole file read-only (OSError when it cannot be read)."""
        with open(self.path, "rb") as f:
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._mmap

    def close(self) -> None:
        if self._mmap is not None:
            # arrays still view the map; it closes when they are gone
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
