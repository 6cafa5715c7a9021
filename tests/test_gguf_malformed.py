"""GGUF files that are not what they claim: every malformed-file path ends in a ModelFileError
(or UnsupportedModelError) that names the file and what is wrong."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from model_files import tiny_checkpoint, write_gguf

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

pytestmark = pytest.mark.usefixtures("session_cache")


# -- malformed files -------------------------------------------------------------------------


def _expect_file_error(path: Path, *words: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        load_model(path)
    err = info.value
    assert str(path) in str(err), "the error names the file"
    assert "\n" not in str(err)
    assert err.__cause__ is None, "no chained traceback"
    assert err.__context__ is None or err.__suppress_context__, "no chained traceback"
    for word in words:
        assert word in err.reason, (word, err.reason)
    return err


def _copy_prefix(src: Path, dst: Path, n: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(n))
    return dst


def test_zero_length_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    _expect_file_error(p, "empty")


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "nope.gguf")


def test_garbage_bytes(tmp_path):
    p = tmp_path / "garbage.gguf"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _expect_file_error(p, "not a GGUF")


def test_garbage_after_magic(tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "garbage2.gguf"
    p.write_bytes(
        b"GGUF" + struct.pack("<I", 3) + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    )
    _expect_file_error(p)


def test_wrong_magic(tmp_path):
    p = _copy_prefix(embedded_model_path(), tmp_path / "magic.gguf", 1 << 20)
    data = bytearray(p.read_bytes())
    data[:4] = b"GGML"
    p.write_bytes(bytes(data))
    _expect_file_error(p, "not a GGUF", "GGML")


@pytest.mark.parametrize(
    ("version", "words"),
    [(struct.pack("<I", 9), "version 9"), (struct.pack(">I", 3), "big-endian")],
)
def test_unsupported_version_is_named(tmp_path, version, words):
    p = _copy_prefix(embedded_model_path(), tmp_path / "v.gguf", 4096)
    data = bytearray(p.read_bytes())
    data[4:8] = version
    p.write_bytes(bytes(data))
    _expect_file_error(p, words)


@pytest.mark.parametrize("cut", [6, 100, 5000, 1_000_000])
def test_truncated_header(tmp_path, cut):
    p = _copy_prefix(embedded_model_path(), tmp_path / "cut.gguf", cut)
    _expect_file_error(p, "truncated")


def test_truncated_tensor_data(tmp_path):
    src = embedded_model_path()
    p = _copy_prefix(src, tmp_path / "cut.gguf", src.stat().st_size - 10_000)
    err = _expect_file_error(p, "truncated", "tensor")
    assert "blk.29" in err.reason or "output" in err.reason or "blk." in err.reason


def _hand_gguf(
    path: Path,
    kv: dict[str, str | int],
    tensors: list[tuple[str, tuple[int, ...], int, int]],
    data: bytes = b"",
) -> Path:
    """A GGUF written byte by byte, to make impossible ones."""

    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, value in kv.items():
        if isinstance(value, str):
            out += s(key) + struct.pack("<I", 8) + s(value)
        else:
            out += s(key) + struct.pack("<II", 4, value)
    for name, dims, qtype, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", qtype, offset)
    out += b"\0" * (-len(out) % 32) + data
    path.write_bytes(out)
    return path


def test_unknown_tensor_type(tmp_path):
    p = _hand_gguf(
        tmp_path / "t.gguf",
        {"general.architecture": "llama"},
        [("w", (32, 2), 99, 0)],
        b"\0" * 4096,
    )
    _expect_file_error(p, "unknown tensor type", "99")


def test_tensor_data_past_eof(tmp_path):
    p = _hand_gguf(
        tmp_path / "t.gguf", {"general.architecture": "llama"}, [("w", (32, 64), 0, 0)], b"\0" * 100
    )
    _expect_file_error(p, "truncated", "'w'")


def test_bad_dimensions(tmp_path):
    p = _hand_gguf(
        tmp_path / "t.gguf", {"general.architecture": "llama"}, [("w", (30, 2), 8, 0)], b"\0" * 4096
    )
    _expect_file_error(p, "block size")


def test_missing_architecture(tmp_path):
    p = _hand_gguf(tmp_path / "t.gguf", {"general.name": "x"}, [])
    _expect_file_error(p, "general.architecture")


def test_missing_required_metadata(tmp_path):
    p = _hand_gguf(tmp_path / "t.gguf", {"general.architecture": "llama"}, [])
    _expect_file_error(p, "llama.block_count")


def test_unsupported_architecture(tmp_path):
    p = _hand_gguf(tmp_path / "t.gguf", {"general.architecture": "mamba"}, [])
    with pytest.raises(UnsupportedModelError) as info:
        load_model(p)
    assert "mamba" in str(info.value) and "llama" in str(info.value) and "qwen3" in str(info.value)


def test_unknown_tensors_are_refused(tmp_path):
    """A llama GGUF with mixture-of-experts tensors must not load as a dense model."""
    config, weights = tiny_checkpoint("llama")
    experts = {"blk.0.ffn_gate_exps.weight": np.zeros((2, 128, 64), np.float32)}
    path = write_gguf(tmp_path / "moe.gguf", config, weights, extra_tensors=experts)
    with pytest.raises(UnsupportedModelError, match="ffn_gate_exps"):
        load_model(path)
