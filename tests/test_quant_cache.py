"""localinfer/quant_cache.py: atomic entries keyed by model file identity and method."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from localinfer.quant_cache import QuantCache, quant_cache_enabled


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"weights" * 10)
    return path


def entry() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        "layer.0.qkv": {
            "qweight": rng.integers(-127, 128, size=(6, 5), dtype=np.int8),
            "scales": rng.random(6, dtype=np.float32),
        },
        "embed": {"qweight": rng.integers(0, 255, size=(4, 8), dtype=np.uint8)},
    }


def test_round_trip(tmp_path: Path, model_file: Path) -> None:
    cache = QuantCache(tmp_path / "cache")
    assert cache.load(model_file, "torch-int8-v1") is None
    folder = cache.save(model_file, "torch-int8-v1", entry())
    assert (folder / "manifest.json").is_file()
    got = cache.load(model_file, "torch-int8-v1")
    assert got is not None and set(got) == set(entry())
    for name, arrays in entry().items():
        for key, value in arrays.items():
            np.testing.assert_array_equal(got[name][key], value)
            assert got[name][key].dtype == value.dtype
    assert cache.nbytes(model_file, "torch-int8-v1") > 0
    # no temporary folders left behind
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]


def test_key_follows_method_and_file_identity(tmp_path: Path, model_file: Path) -> None:
    cache = QuantCache(tmp_path / "cache")
    cache.save(model_file, "torch-int8-v1", entry())
    assert cache.load(model_file, "torch-int4-g64-v1") is None
    st = model_file.stat()
    os.utime(model_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # file replaced
    assert cache.load(model_file, "torch-int8-v1") is None


def test_damaged_entry_is_dropped(tmp_path: Path, model_file: Path) -> None:
    cache = QuantCache(tmp_path / "cache")
    folder = cache.save(model_file, "m", entry())
    next(folder.glob("*.npy")).write_bytes(b"not numpy")
    assert cache.load(model_file, "m") is None
    assert not folder.exists()


def test_overwrite_replaces_entry(tmp_path: Path, model_file: Path) -> None:
    cache = QuantCache(tmp_path / "cache")
    cache.save(model_file, "m", entry())
    cache.save(model_file, "m", {"x": {"a": np.arange(3)}})
    got = cache.load(model_file, "m")
    assert got is not None and list(got) == ["x"]


def test_default_root_and_switch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))
    assert QuantCache().root == tmp_path / "quant"
    monkeypatch.setenv("LOCALINFER_QUANT_CACHE", "0")
    assert not quant_cache_enabled()
    monkeypatch.delenv("LOCALINFER_QUANT_CACHE")
    assert quant_cache_enabled()
