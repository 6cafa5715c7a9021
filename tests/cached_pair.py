"""The hash that names the folder a tiny model and its projector are written once into
(bench/random_mmproj.written_once; tests/vision_model.py's Gemma 3, tests/qwen2vl_model.py's
Qwen2-VL): their writers' sources."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf


def sources_key(*modules: str) -> str:
    """What the files hold, as a short hash: the writers' source files and gguf's version."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module).read_bytes())
    digest.update(gguf.__version__.encode() if hasattr(gguf, "__version__") else b"")
    return digest.hexdigest()[:10]
