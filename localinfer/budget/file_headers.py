"""Exact weight bytes of a model on disk from its file headers, without reading tensor data.

The headers are parsed by the loaders' own readers (GGUFFile, SafetensorsFile: every kind of
broken file becomes a one-line ModelFileError, and the data stays memory-mapped and unread), and a
GGUF's architecture numbers are read by localinfer/facts/gguf_header.py, as loading reads them.
GGUFFile is ~30x faster than gguf.GGUFReader on the embedded model's 49k-token vocabulary.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from localinfer.facts.arch import ArchSpec
from localinfer.facts.gguf_header import arch_from_gguf
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES
from localinfer.loading.safetensors_dir import weight_files
from localinfer.loading.safetensors_file import DTYPE_SIZES, SafetensorsFile


@dataclass(frozen=True, slots=True)
class WeightsHeader:
    """What a model file's header says about its weights."""

    weight_bytes: int  # sum of tensor data bytes
    params: int  # sum of tensor element counts
    quant: str  # the file's own quantization: "Q4_1", "bf16", ...
    arch: ArchSpec | None  # None where the header alone can't say (safetensors: see config.json)
    # GGUF: the bytes when matrices in STORED_BLOCK_TYPES stay as stored and every other tensor is
    # float32: what the torch runner's native CPU kernels hold (backends/torch/block_weights.py).
    # None when no matrix is in one of those types.
    kept_block_bytes: int | None = None


def read_gguf_header(path: str | Path) -> WeightsHeader:
    """Exact tensor bytes and architecture numbers of a GGUF file (header only)."""
    with GGUFFile(path) as gguf:
        return gguf_weights_header(gguf)


def gguf_weights_header(gguf: GGUFFile) -> WeightsHeader:
    """The weights header of an open GGUF file (one a loader opened serves too); block_count is
    checked against the blk.N tensors as the loader does, so a million layers is named, not
    budgeted."""
    tensors = list(gguf.tensors.values())
    quant = gguf.file_type()
    kept = [len(t.shape) == 2 and t.type_name in STORED_BLOCK_TYPES for t in tensors]
    return WeightsHeader(
        weight_bytes=sum(int(t.nbytes) for t in tensors),
        params=sum(int(t.n_elements) for t in tensors),
        quant=quant.lower() if quant in ("F32", "F16", "BF16") else quant,
        arch=arch_from_gguf(gguf.metadata, gguf.tensors, gguf.path),
        kept_block_bytes=(
            sum(
                int(t.nbytes) if k else 4 * int(t.n_elements)
                for t, k in zip(tensors, kept, strict=True)
            )
            if any(kept)
            else None
        ),
    )


def read_safetensors_headers(directory: str | Path) -> WeightsHeader:
    """Sum the tensors of a model directory's .safetensors files (sharded or not)."""
    weight_bytes = params = 0
    by_dtype: Counter[str] = Counter()
    for file in weight_files(Path(directory)):
        with SafetensorsFile(file) as weights:
            for info in weights.tensors.values():
                weight_bytes += info.nbytes
                params += math.prod(info.shape)
                by_dtype[info.dtype] += info.nbytes
    quant = by_dtype.most_common(1)[0][0].lower() if by_dtype else "unknown"
    return WeightsHeader(weight_bytes=weight_bytes, params=params, quant=quant, arch=None)


def safetensors_dtype_bytes(dtype: str) -> int:
    return DTYPE_SIZES.get(dtype.upper(), 2)
