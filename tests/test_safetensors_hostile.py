"""A safetensors header whose shape product overflows int64 (or has negative dimensions) is a
one-line ModelFileError, not a wrapped byte count that passes the size check."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from localinfer.errors import ModelFileError
from localinfer.loading.safetensors_file import SafetensorsFile


def _file(path: Path, shape: list[int], nbytes: int) -> Path:
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * nbytes)
    return path


@pytest.mark.parametrize(
    "shape, nbytes",
    [
        ([2**62, 4], 0),  # 2^64 elements x 4 bytes wraps to 0 in int64
        ([16, 2**60 + 1], 64),  # 2^64 + 16 elements: wraps to 16 elements, 64 bytes
        ([-1, -4], 16),  # negative dimensions whose product looks right
    ],
)
def test_impossible_shapes_are_refused(tmp_path: Path, shape: list[int], nbytes: int) -> None:
    path = _file(tmp_path / "model.safetensors", shape, nbytes)
    with pytest.raises(ModelFileError) as info:
        SafetensorsFile(path)
    assert "'w'" in str(info.value) and "\n" not in str(info.value)
