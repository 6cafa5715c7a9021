"""Reading one .safetensors file: JSON header + memory-mapped tensor data.

Parsed here rather than with ``safetensors.safe_open(framework="numpy")`` because numpy has no
bfloat16, and so a damaged file becomes a ModelFileError with a one-line reason.

Layout: u64 little-endian header length N, N bytes of JSON
``{"name": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {}}``,
then the data; offsets are relative to byte 8 + N.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localinfer.errors import ModelFileError
from localinfer.loading.mapped_file import MappedFile

# safetensors dtype -> numpy dtype as stored (BF16 is read as uint16 and widened by hand).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# Bytes per element of every safetensors dtype, the ones numpy cannot hold too (FP8, unsigned).
DTYPE_SIZES: dict[str, int] = {
    **{name: dtype.itemsize for name, dtype in DTYPES.items()},
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(slots=True, frozen=True)
class SafetensorInfo:
    name: str
    dtype: str  # safetensors dtype string, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


class SafetensorsFile(MappedFile):
    """One memory-mapped .safetensors file."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.tensors: dict[str, SafetensorInfo] = {}
        self.metadata: dict[str, str] = {}
        self._open()

    def _fail(self, reason: str) -> ModelFileError:
        self.close()
        return ModelFileError(self.path, reason)

    def _open(self) -> None:
        if not self.path.is_file():
            raise ModelFileError(self.path, "no such file")
        size = self.path.stat().st_size
        if size < 8:
            raise ModelFileError(self.path, f"truncated safetensors file ({size} bytes)")
        mapped = self._map()
        (n,) = struct.unpack_from("<Q", mapped, 0)
        if n > MAX_HEADER or 8 + n > size:
            raise self._fail(
                f"truncated or not a safetensors file (header of {n} bytes, file of {size})"
            )
        try:
            header = json.loads(bytes(mapped[8 : 8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._fail(f"malformed safetensors header: {exc}") from None
        if not isinstance(header, dict):
            raise self._fail("malformed safetensors header: not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        data_start = 8 + n
        for name, spec in header.items():
            try:
                dtype = str(spec["dtype"])
                shape = tuple(int(d) for d in spec["shape"])
                begin, end = (int(x) for x in spec["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise self._fail(f"malformed entry for tensor '{name}'") from None
            if any(d < 0 for d in shape):
                raise self._fail(f"tensor '{name}' has a negative dimension {shape}")
            if dtype in DTYPE_SIZES:
                # Python ints: an int64 product of huge dimensions wraps to a plausible size
                want = math.prod(shape) * DTYPE_SIZES[dtype]
                if end - begin != want:
                    raise self._fail(
                        f"tensor '{name}' has {end - begin} bytes, its shape needs {want}"
                    )
            if begin < 0 or end < begin or data_start + end > size:
                raise self._fail(
                    f"truncated safetensors file: tensor '{name}' ends at byte "
                    f"{data_start + end}, the file has {size}"
                )
            self.tensors[name] = SafetensorInfo(name, dtype, shape, data_start + begin, end - begin)

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 (a new array)."""
        info = self.tensors[name]
        if info.dtype not in DTYPES:
            raise ModelFileError(
                self.path, f"tensor '{name}' has dtype {info.dtype}, which localinfer cannot read"
            )
        if self._mmap is None:
            raise ModelFileError(self.path, "file is closed")
        stored = DTYPES[info.dtype]
        count = info.nbytes // stored.itemsize
        raw = np.frombuffer(self._mmap, dtype=stored, count=count, offset=info.offset)
        if info.dtype == "BF16":
            # bfloat16 is the top half of a float32: shift into place.
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out = raw.astype(np.float32)
        return out.reshape(info.shape)
