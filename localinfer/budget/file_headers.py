"""Exact weight bytes and architecture numbers from file headers, without reading tensor data.

GGUF: localinfer.loading.gguf_file parses the header and memory-maps the data (nothing is read
until touched); it is ~30x faster than gguf.GGUFReader on the embedded model's 49k-token vocab.
safetensors: each file starts with an 8-byte length and a JSON header that lists every tensor's
dtype, shape and byte range.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.facts.arch import ArchSpec
from localinfer.errors import ModelFileError
from localinfer.loading.gguf_checks import check_layer_count
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES

# GGUF general.architecture -> HF model_type
_GGUF_ARCHS = {
    "qwen3moe": "qwen3_moe",
    "deepseek2": "deepseek_v2",
}


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
    """Exact tensor bytes and architecture numbers of a GGUF file (header only; the tensor data
    stays memory-mapped and unread). Uses the project's GGUF parser, which turns every kind of
    broken file into a one-line ModelFileError; block_count is checked against the blk.N
    tensors as the loader does, so a million layers is named, not budgeted."""
    from localinfer.loading.gguf_file import GGUFFile

    with GGUFFile(path) as gguf:
        tensors = list(gguf.tensors.values())
        quant = gguf.file_type()
        arch = _gguf_arch(gguf.metadata, gguf.tensors, Path(path))
    kept = [len(t.shape) == 2 and t.type_name in STORED_BLOCK_TYPES for t in tensors]
    return WeightsHeader(
        weight_bytes=sum(int(t.nbytes) for t in tensors),
        params=sum(int(t.n_elements) for t in tensors),
        quant=quant.lower() if quant in ("F32", "F16", "BF16") else quant,
        arch=arch,
        kept_block_bytes=(
            sum(
                int(t.nbytes) if k else 4 * int(t.n_elements)
                for t, k in zip(tensors, kept, strict=True)
            )
            if any(kept)
            else None
        ),
    )


def _gguf_arch(meta: dict[str, Any], tensors: dict[str, Any], path: Path) -> ArchSpec:
    arch = meta.get("general.architecture")
    if not arch:
        raise ModelFileError(path, "GGUF header has no general.architecture")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}")
        if value is None:
            return default
        if isinstance(value, (list, tuple, np.ndarray)):  # per-layer values: the largest rules
            return max((int(v) for v in value), default=default)
        return value

    n_layers = get("block_count")
    hidden = get("embedding_length")
    n_heads = get("attention.head_count")
    if not (n_layers and hidden and n_heads):
        raise ModelFileError(path, f"GGUF header lacks {arch}.block_count/embedding_length/heads")
    check_layer_count(path, arch, int(n_layers), tensors)
    n_kv = get("attention.head_count_kv", n_heads)
    vocab = get("vocab_size")
    if vocab is None:
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else _embedding_rows(tensors)
    fields: dict[str, Any] = {
        "arch": _GGUF_ARCHS.get(arch, arch),
        "n_layers": n_layers,
        "hidden_size": hidden,
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "head_dim": get("attention.key_length", hidden // n_heads),
        "ffn_size": get("feed_forward_length") or get("expert_feed_forward_length") or hidden,
        "vocab_size": vocab,
        "max_ctx": get("context_length", 2048),
        "tied_embeddings": "output.weight" not in tensors,
        "qk_norm": arch in ("qwen3", "qwen3moe", "gemma3"),
    }
    window = get("attention.sliding_window")
    if window:
        fields["sliding_window"] = window
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, (list, tuple, np.ndarray)):  # per layer: true = sliding
            fields["sliding_layers"] = tuple(i for i, on in enumerate(pattern) if on)
        elif pattern:
            fields["sliding_pattern"] = int(pattern)
        elif arch == "gemma3":
            # llama.cpp hard-codes Gemma 3's pattern (every 6th layer global) when not stored.
            fields["sliding_pattern"] = 6
    if get("expert_count"):
        fields.update(
            n_experts=get("expert_count"),
            n_experts_per_token=get("expert_used_count", 1),
            moe_ffn_size=get("expert_feed_forward_length", fields["ffn_size"]),
            n_shared_experts=get("expert_shared_count", 0),
            first_dense_layers=get("leading_dense_block_count", 0),
        )
    if get("attention.kv_lora_rank"):
        fields.update(
            kv_lora_rank=get("attention.kv_lora_rank"),
            qk_rope_head_dim=get("rope.dimension_count"),
        )
    try:
        return ArchSpec.from_fields(fields)
    except ValueError as exc:
        raise ModelFileError(path, f"GGUF header has inconsistent numbers ({exc})") from None


def _embedding_rows(tensors: dict[str, Any]) -> int:
    embd = tensors.get("token_embd.weight")
    return int(embd.shape[0]) if embd is not None else 0  # numpy order: [vocab, hidden]


_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def read_safetensors_headers(directory: str | Path) -> WeightsHeader:
    """Sum the tensors of every *.safetensors file in a directory (sharded or not)."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelFileError(directory, "no *.safetensors files")
    weight_bytes = params = 0
    by_dtype: Counter[str] = Counter()
    for file in files:
        header, data_start = _safetensors_header(file)
        data_end = data_start
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                start, end = (int(x) for x in info["data_offsets"])
                shape = [int(d) for d in info["shape"]]
                dtype = str(info["dtype"])
            except (KeyError, TypeError, ValueError):
                raise ModelFileError(
                    file, f"tensor '{name}' has a malformed header entry"
                ) from None
            data_end = max(data_end, data_start + end)
            numel = 1
            for dim in shape:
                numel *= dim
            weight_bytes += end - start
            params += numel
            by_dtype[dtype] += end - start
        if file.stat().st_size < data_end:
            raise ModelFileError(file, "truncated: tensor data runs past the end of the file")
    quant = by_dtype.most_common(1)[0][0].lower() if by_dtype else "unknown"
    return WeightsHeader(weight_bytes=weight_bytes, params=params, quant=quant, arch=None)


def _safetensors_header(file: Path) -> tuple[dict[str, Any], int]:
    """The JSON header and the offset where tensor data starts."""
    with file.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) != 8:
            raise ModelFileError(file, "truncated safetensors file (no header length)")
        (length,) = struct.unpack("<Q", prefix)
        if length > 100_000_000:
            raise ModelFileError(file, f"implausible safetensors header length {length}")
        raw = fh.read(length)
    if len(raw) != length:
        raise ModelFileError(file, "truncated safetensors header")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(file, f"safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelFileError(file, "safetensors header is not a JSON object")
    return header, 8 + length


def safetensors_dtype_bytes(dtype: str) -> int:
    return _SAFETENSORS_DTYPE_BYTES.get(dtype.upper(), 2)
