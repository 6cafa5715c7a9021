"""A tiny model and its projector, written once into a folder named by a hash of the sources
that write them (tests/vision_model.py's Gemma 3, tests/qwen2vl_model.py's Qwen2-VL)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import gguf


def sources_key(*modules: str) -> str:
    """What the files hold, as a short hash: the writers' source files and gguf's version."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module).read_bytes())
    digest.update(gguf.__version__.encode() if hasattr(gguf, "__version__") else b"")
    return digest.hexdigest()[:10]


def cached_pair(
    stem: str,
    key: str,
    names: tuple[str, str],
    write: Callable[[Path], object],
    folder: Path | None = None,
) -> tuple[Path, Path]:
    """The model and projector ``names`` that ``write(folder)`` makes, in ``folder / stem-key``
    (default folder: bench/random_gguf.py's cache); one writer at a time (a lock beside it)."""
    from bench.llamacpp_source import dev_cache, locked

    root = folder or dev_cache() / "random-gguf"
    target = root / f"{stem}-{key}"
    model, projector = target / names[0], target / names[1]
    if model.is_file() and projector.is_file():
        return model, projector
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f"{target.name}.lock"):
        if not (model.is_file() and projector.is_file()):
            part = root / f"{target.name}.part"
            write(part)
            part.rename(target)
    return model, projector
