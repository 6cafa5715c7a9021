"""Exact weight bytes of a model from its file headers, without reading tensor data.

The headers are parsed by the loaders' own readers (GGUFFile, SafetensorsFile: every kind of
broken file becomes a one-line ModelFileError, and the data stays memory-mapped and unread), and a
GGUF's architecture numbers are read by localinfer/facts/gguf_header.py, as loading reads them.
GGUFFile is ~30x faster than gguf.GGUFReader on the embedded model's 49k-token vocabulary.

The same summaries serve headers read from the Hub (localinfer/budget/remote_facts.py): a GGUF
header read over HTTP is a GGUFFile too, and safetensors headers come as SafetensorsTensor lists,
so a model budgeted before download and after it is counted by the same code.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from localinfer.budget.gguf_prefix import file_reader, read_header
from localinfer.budget.vision import VisionShape, vision_shape
from localinfer.facts.arch import ArchSpec
from localinfer.facts.gguf_header import arch_from_gguf
from localinfer.facts.held_weights import StoredTensor
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.gguf_split import open_gguf
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES
from localinfer.loading.safetensors_dir import _hf_name as loaded_tensor_name
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
    # GGUF: every tensor as stored (name, type, shape, bytes), for the runners' own forms
    # (BackendProfile.held_gguf_weights); empty for safetensors.
    tensors: tuple[StoredTensor, ...] = ()


def read_gguf_header(path: str | Path) -> WeightsHeader:
    """Exact tensor bytes and architecture numbers of a GGUF file (header only); the first part
    of a split GGUF counts every part (found beside it, as the loader finds them)."""
    with open_gguf(path) as gguf:
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
        tensors=tuple(StoredTensor(t.name, t.type_name, t.shape, int(t.nbytes)) for t in tensors),
    )


@dataclass(frozen=True, slots=True)
class SafetensorsTensor:
    """One tensor of a safetensors header, as stored."""

    name: str
    dtype: str  # "BF16", "F32", ...
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class Projector:
    """A vision projector (mmproj*.gguf) as llama.cpp's multimodal code loads it: every tensor,
    and its encoder's shape (budget/vision.py; None: no vision encoder the budget can cost)."""

    name: str
    weight_bytes: int
    params: int
    vision: VisionShape | None = None


def projector_header(name: str, gguf: GGUFFile) -> Projector:
    """The tensor bytes of a projector's GGUF and its encoder's shape (its metadata and
    directory only: a CLIP header has no LM architecture to read)."""
    tensors = gguf.tensors.values()
    types = {t.name: (t.type_name, int(t.nbytes)) for t in tensors}
    return Projector(
        name,
        sum(t.nbytes for t in tensors),
        sum(t.n_elements for t in tensors),
        vision_shape(gguf.metadata, types),
    )


def read_projector(path: Path, name: str) -> Projector:
    """projector_header of a file on disk."""
    size = path.stat().st_size
    return projector_header(name, read_header(str(path), size, file_reader(path), first_part=False))


def read_safetensors_headers(directory: str | Path, tied_embeddings: bool = False) -> WeightsHeader:
    """Sum the tensors of a model directory's .safetensors files (sharded or not) that loading
    keeps (see safetensors_weights_header)."""
    tensors: list[SafetensorsTensor] = []
    for file in weight_files(Path(directory)):
        with SafetensorsFile(file) as weights:
            tensors += [
                SafetensorsTensor(info.name, info.dtype, info.shape, info.nbytes)
                for info in weights.tensors.values()
            ]
    return safetensors_weights_header(tensors, tied_embeddings)


def safetensors_weights_header(
    tensors: Iterable[SafetensorsTensor], tied_embeddings: bool
) -> WeightsHeader:
    """The weights loading keeps of these tensors (files in weight_files order): a multimodal
    checkpoint's vision tower and projector are left out, and so is a stored lm_head.weight
    when config.json ties the embeddings (Qwen3-0.6B's model.safetensors holds both copies:
    751,632,384 parameters stored, 596,049,920 loaded)."""
    weight_bytes = params = 0
    by_dtype: Counter[str] = Counter()
    for tensor in tensors:
        name = loaded_tensor_name(tensor.name)
        if name is None or (tied_embeddings and name == "lm_head.weight"):
            continue
        weight_bytes += tensor.nbytes
        params += math.prod(tensor.shape)
        by_dtype[tensor.dtype] += tensor.nbytes
    quant = by_dtype.most_common(1)[0][0].lower() if by_dtype else "unknown"
    return WeightsHeader(weight_bytes=weight_bytes, params=params, quant=quant, arch=None)


def safetensors_dtype_bytes(dtype: str) -> int:
    return DTYPE_SIZES.get(dtype.upper(), 2)
