"""localinfer/quant_cache.py: atomic entries keyed by model file identity and method; concurrent
writers of one key, malformed manifests, killed writers' temporary folders."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
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


@pytest.mark.parametrize(
    "manifest",
    [
        "[]",
        "null",
        "{ not json",
        '{"format": 1, "method": "m", "tensors": null}',
        '{"format": 1, "method": "m", "tensors": {"x": null}}',
        '{"format": 1, "method": "m", "tensors": {"x": {"a": 5}}}',
        '{"format": 1, "method": "m", "tensors": {"x": {"a": "../outside.npy"}}}',
    ],
)
def test_malformed_manifest_is_a_miss_not_a_crash(
    tmp_path: Path, model_file: Path, manifest: str
) -> None:
    cache = QuantCache(tmp_path / "cache")
    folder = cache.save(model_file, "m", entry())
    (folder / "manifest.json").write_text(manifest)
    np.save(tmp_path / "cache" / "outside.npy", np.arange(3))
    assert cache.load(model_file, "m") is None
    assert not folder.exists()  # dropped, so the next save rebuilds it
    cache.save(model_file, "m", entry())
    assert cache.load(model_file, "m") is not None


def test_concurrent_writers_of_one_key_threads(tmp_path: Path, model_file: Path) -> None:
    # Every round, several threads publish the same key at once; rename() releases the GIL,
    # so the renames really race. Each save succeeds; the entry left is complete.
    cache_root = tmp_path / "cache"
    errors: list[BaseException] = []

    def write(barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            QuantCache(cache_root).save(model_file, "m", entry())
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    for _ in range(30):
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=write, args=(barrier,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    _assert_one_complete_entry(cache_root, model_file)


_WRITER = """
import sys
from pathlib import Path
import numpy as np
from localinfer.quant_cache import QuantCache

root, model, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
entry = {
    "layer.0.qkv": {
        "qweight": rng.integers(-127, 128, size=(6, 5), dtype=np.int8),
        "scales": rng.random(6, dtype=np.float32),
    },
    "embed": {"qweight": rng.integers(0, 255, size=(4, 8), dtype=np.uint8)},
}
print("ready", flush=True)
sys.stdin.readline()  # all writers start together
for _ in range(rounds):
    QuantCache(root).save(model, "m", entry)
"""


def test_concurrent_writers_of_one_key_processes(tmp_path: Path, model_file: Path) -> None:
    cache_root = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(cache_root), str(model_file), "30"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    _assert_one_complete_entry(cache_root, model_file)


def _assert_one_complete_entry(cache_root: Path, model_file: Path) -> None:
    got = QuantCache(cache_root).load(model_file, "m")
    assert got is not None
    for name, arrays in entry().items():
        for key, value in arrays.items():
            np.testing.assert_array_equal(got[name][key], value)
    assert [p.name for p in cache_root.iterdir()] == [QuantCache(cache_root).key(model_file, "m")]


_HANGING_WRITER = """
import sys, time
from pathlib import Path
import numpy as np
import localinfer.quant_cache as qc

real_save = np.save

def save_then_hang(*args, **kwargs):  # one array written, then the process is stuck
    real_save(*args, **kwargs)
    print("written", flush=True)
    time.sleep(600)

qc.np.save = save_then_hang
qc.QuantCache(Path(sys.argv[1])).save(Path(sys.argv[2]), "m", {"x": {"a": np.arange(3)}})
"""


def _start_hanging_writer(root: Path, model_file: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HANGING_WRITER, str(root), str(model_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "written"
    return proc


def test_a_killed_writers_folder_is_swept_and_a_live_ones_kept(
    tmp_path: Path, model_file: Path
) -> None:
    root = tmp_path / "cache"
    live = _start_hanging_writer(root, model_file)
    try:
        dead = _start_hanging_writer(root, model_file)
        dead.kill()
        dead.wait()
        old = root / ".tmp-k3j4h5x9"  # a temporary from before pids were in the names
        old.mkdir()
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        temps = {p.name for p in root.glob(".tmp-*")}
        assert f".tmp-{dead.pid}-" in " ".join(temps) and old.name in temps
        assert QuantCache(root).load(model_file, "m") is None  # a use of the cache sweeps
        left = {p.name for p in root.glob(".tmp-*")}
        assert [n for n in left if n.startswith(f".tmp-{live.pid}-")]
        assert not [n for n in left if n.startswith(f".tmp-{dead.pid}-")]
        assert old.name not in left
    finally:
        live.kill()
        live.wait()
