"""Reading and validating a GGUF file: metadata, tensor directory, memory-mapped tensor data.

The header is parsed here (not with ``gguf.GGUFReader``) so every way a file can be broken -- an
empty file, a wrong magic, a cut-off header, tensor data past the end, an unknown tensor type --
becomes one ``ModelFileError(path, reason)`` with a one-line reason. Tensor bytes stay in the
memory map until a tensor is asked for; ``gguf.quants`` does the dequantization.

GGUF layout (v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 kv count,
the key/value pairs, the tensor infos (name, n_dims, dims innermost-first, u32 type, u64 offset),
padding to ``general.alignment``, then the tensor data.
"""

from __future__ import annotations

import hashlib
import logging
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
from gguf import quants as gguf_quants

from localinfer.errors import ModelFileError
from localinfer.loading.gguf_checks import check_header
from localinfer.loading.gguf_cursor import Corrupt, Cursor, Truncated
from localinfer.loading.mapped_file import MappedFile

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
# ggml counts elements and bytes in int64: any tensor beyond that is not a real one.
MAX_TENSOR_ELEMENTS = 2**63 - 1


@dataclass(slots=True, frozen=True)
class GGUFTensorInfo:
    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]  # numpy order: outermost first (GGUF stores innermost first)
    qtype: int  # GGMLQuantizationType value
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.qtype).name

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)  # Python ints: never wraps


class GGUFFile(MappedFile):
    """An open, validated GGUF file. Tensor data stays memory-mapped."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        try:
            self._open()
        except Truncated:
            self.close()
            raise ModelFileError(self.path, "truncated GGUF file (the header ends early)") from None
        except Corrupt as exc:
            self.close()
            raise ModelFileError(self.path, f"malformed GGUF file: {exc}") from None
        except ModelFileError:
            self.close()
            raise

    # -- parsing ---------------------------------------------------------------------------

    def _open(self) -> None:
        cur = Cursor(self._map_file(), 4)
        n_tensors, n_kv = self._read_counts(cur)
        self._read_metadata(cur, n_kv)
        _ = self.architecture  # every model GGUF names one; fail here, not deep in a loader
        self._read_tensor_directory(cur, n_tensors)
        self._check_header()

    def _open_later_part(self) -> None:
        """A later part of a split GGUF: its metadata (split.*) and tensor directory only; the
        architecture and the header checks belong to the first part."""
        cur = Cursor(self._map_file(), 4)
        n_tensors, n_kv = self._read_counts(cur)
        self._read_metadata(cur, n_kv)
        self._read_tensor_directory(cur, n_tensors)

    def _check_header(self) -> None:
        stray = check_header(self.path, self.metadata, self.tensors)
        if stray:
            # Never read by localinfer; dropped so that nothing later can index by them.
            dropped = ", ".join(f"{key} = {self.metadata.pop(key)}" for key in stray)
            log.warning("%s: ignoring %s (outside the vocabulary; not used)", self.path, dropped)

    def _map_file(self) -> memoryview:
        """The whole file, memory-mapped, once its size and magic say it may be a GGUF."""
        if not self.path.exists():
            raise ModelFileError(self.path, "no such file")
        if not self.path.is_file():
            raise ModelFileError(self.path, "not a regular file")
        size = self.path.stat().st_size
        if size == 0:
            raise ModelFileError(self.path, "empty file (0 bytes), not a GGUF model")
        try:
            mapped = self._map()
        except OSError as exc:
            raise ModelFileError(self.path, f"cannot read file: {exc.strerror or exc}") from None
        self.size = size
        buf = memoryview(mapped)
        if size < 4 or bytes(buf[:4]) != GGUF_MAGIC:
            head = bytes(buf[:4])
            raise ModelFileError(
                self.path, f"not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r})"
            )
        return buf

    def _read_metadata(self, cur: Cursor, n_kv: int) -> None:
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("<I")
            self.metadata[key] = cur.value(vtype, key)
        self.header_kv_end = cur.pos

    def _read_counts(self, cur: Cursor) -> tuple[int, int]:
        """The version check, then (tensor count, metadata key count)."""
        self.version = cur.unpack("<I")
        if struct.unpack("<I", struct.pack(">I", self.version))[0] in SUPPORTED_VERSIONS:
            raise ModelFileError(self.path, "big-endian GGUF files are not supported")
        if self.version not in SUPPORTED_VERSIONS:
            raise ModelFileError(
                self.path,
                f"unsupported GGUF version {self.version} (supported: "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))})",
            )
        n_tensors = cur.unpack("<Q")
        n_kv = cur.unpack("<Q")
        # Every kv pair and tensor info takes well over 8 bytes: bounds absurd counts by size.
        if n_tensors * 8 > self.size or n_kv * 8 > self.size:
            raise ModelFileError(
                self.path,
                f"truncated or corrupt GGUF file: the header declares {n_tensors} tensors and "
                f"{n_kv} metadata keys, the file has {self.size} bytes",
            )
        return n_tensors, n_kv

    def _read_tensor_directory(self, cur: Cursor, n_tensors: int) -> None:
        raw_infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise Corrupt(f"tensor '{name}' has {n_dims} dimensions")
            dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
            qtype = cur.unpack("<I")
            offset = cur.unpack("<Q")
            raw_infos.append((name, dims, qtype, offset))

        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool):
            raise Corrupt(f"general.alignment is {type(alignment).__name__}, not an integer")
        if alignment <= 0 or alignment & (alignment - 1):
            raise Corrupt(f"general.alignment {alignment} is not a power of two")
        self.alignment = alignment
        self.data_offset = (cur.pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, dims, qtype, rel_offset in raw_infos:
            info = self._tensor_info(name, dims, qtype, rel_offset)
            if name in self.tensors:
                raise Corrupt(f"tensor '{name}' appears twice")
            self.tensors[name] = info

    def _tensor_info(
        self, name: str, dims: tuple[int, ...], qtype: int, rel_offset: int
    ) -> GGUFTensorInfo:
        try:
            ggml_type = GGMLQuantizationType(qtype)
        except ValueError:
            raise ModelFileError(
                self.path, f"tensor '{name}' has unknown tensor type id {qtype}"
            ) from None
        if ggml_type not in GGML_QUANT_SIZES:
            raise ModelFileError(
                self.path, f"tensor '{name}' has unsupported type {ggml_type.name}"
            )
        if any(d == 0 for d in dims):
            raise Corrupt(f"tensor '{name}' has a zero dimension {dims}")
        # Python ints throughout: a product of u64 dimensions in int64 wraps to a small or
        # negative byte count that would pass the end-of-file check below.
        if math.prod(dims) > MAX_TENSOR_ELEMENTS:
            raise Corrupt(f"tensor '{name}' dimensions {dims} hold more than 2^63 elements")
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
        if dims[0] % block_size:
            raise Corrupt(
                f"tensor '{name}' row length {dims[0]} is not a multiple of the "
                f"{ggml_type.name} block size {block_size}"
            )
        n_rows = math.prod(dims[1:])
        nbytes = n_rows * (dims[0] // block_size) * type_size
        if rel_offset % self.alignment:
            raise Corrupt(f"tensor '{name}' data offset {rel_offset} is not aligned")
        offset = self.data_offset + rel_offset
        if offset + nbytes > self.size:
            raise ModelFileError(
                self.path,
                f"truncated GGUF file: tensor '{name}' needs bytes up to {offset + nbytes} "
                f"but the file has {self.size}",
            )
        return GGUFTensorInfo(name, tuple(reversed(dims)), int(ggml_type), offset, nbytes)

    # -- access ------------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFileError(self.path, "missing metadata key 'general.architecture'")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(self.path, f"missing metadata key '{key}'")
        return self.metadata[key]

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor, zero-copy: float types as their dtype, quantized types as
        uint8 rows ``[*outer, bytes_per_row]``."""
        info = self.tensors[name]
        if self._mmap is None:
            raise ModelFileError(self.path, "file is closed")
        qtype = GGMLQuantizationType(info.qtype)
        dtype = {
            GGMLQuantizationType.F32: np.float32,
            GGMLQuantizationType.F16: np.float16,
            GGMLQuantizationType.F64: np.float64,
        }.get(qtype)
        if dtype is not None:
            count = info.n_elements
            return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=info.offset).reshape(
                info.shape
            )
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        row_bytes = info.shape[-1] // block_size * type_size
        arr = np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return arr.reshape((*info.shape[:-1], row_bytes))

    def dequantize(self, name: str) -> np.ndarray:
        """A tensor as float32, numpy shape (outermost first). New memory; the map is untouched."""
        info = self.tensors[name]
        qtype = GGMLQuantizationType(info.qtype)
        raw = self.raw(name)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.F64):
            return raw.astype(np.float32)  # always a copy
        try:
            out = gguf_quants.dequantize(raw, qtype)
        except NotImplementedError:
            raise ModelFileError(
                self.path, f"tensor '{name}' has type {qtype.name}, which cannot be dequantized"
            ) from None
        return np.ascontiguousarray(out, dtype=np.float32).reshape(info.shape)

    def file_type(self) -> str:
        """The dominant storage type: general.file_type when present ("Q4_1", "Q4_K_M"), else the
        type holding the most bytes among matrices."""
        ftype = self.metadata.get("general.file_type")
        if isinstance(ftype, int):
            try:
                name = LlamaFileType(int(ftype)).name
                for prefix in ("MOSTLY_", "ALL_"):
                    name = name.removeprefix(prefix)
                return name
            except ValueError:
                pass
        totals: dict[str, int] = {}
        for info in self.tensors.values():
            if len(info.shape) >= 2:
                totals[info.type_name] = totals.get(info.type_name, 0) + info.nbytes
        return max(totals, key=totals.__getitem__) if totals else "F32"

    def tensor_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def header_digest(self) -> str:
        """SHA-256 of the metadata section: changes whenever the vocabulary or config does."""
        assert self._mmap is not None
        return hashlib.sha256(self._mmap[: self.header_kv_end]).hexdigest()

    def release_pages(self) -> None:
        """Drop the map's pages from this process (Linux MADV_DONTNEED) once a runner has copied
        what it needs: they stop counting in its resident memory, and any later read faults them
        back in from the page cache, so every array viewing the map stays valid."""
        if self._mmap is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.tensors)} tensors)"
