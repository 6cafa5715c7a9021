"""A GGUF header's metadata read into ArchSpec's fields (llama.cpp's key names -> Hugging Face
terms): the one reading that loading (its ModelConfig) and the budget (its ArchSpec) build on.

The header itself is parsed and its numbers' types and ranges checked by
localinfer/loading/gguf_file.py (GGUFFile); this module reads the numbers from the parsed metadata
and the tensor directory, for every architecture llama.cpp knows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.errors import ModelFileError
from localinfer.facts.arch import ArchFields, ArchSpec
from localinfer.facts.pooling import is_reranker_file

# GGUF general.architecture -> Hugging Face model_type, where the two differ.
_HF_MODEL_TYPES = {"qwen3moe": "qwen3_moe", "deepseek2": "deepseek_v2", "gpt-oss": "gpt_oss"}
# llama.cpp hard-codes Gemma 3's pattern (every sixth layer attends globally) when none is stored,
# and gpt-oss's (every other layer).
GEMMA3_SLIDING_PATTERN = 6
_DEFAULT_SLIDING_PATTERNS = {"gemma3": GEMMA3_SLIDING_PATTERN, "gpt-oss": 2}
_REQUIRED = ("block_count", "embedding_length", "attention.head_count")
_LAYER = re.compile(r"^blk\.(\d+)\.")


def arch_fields_from_gguf(
    metadata: Mapping[str, Any], tensors: Mapping[str, Any], path: str | Path
) -> ArchFields:
    """ArchSpec's fields from a GGUF header (its metadata and tensor directory, as GGUFFile holds
    them). Raises ModelFileError for a missing key, or a block_count the blk.N tensors disagree
    with; the numbers themselves are checked by whoever builds on the fields."""
    arch = str(metadata.get("general.architecture") or "")
    if not arch:
        raise ModelFileError(path, "missing metadata key 'general.architecture'")

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}")
        if value is None:
            return default
        if isinstance(value, list | tuple | np.ndarray):  # per-layer values: the largest rules
            return max((int(v) for v in value), default=default)
        return value

    missing = [f"'{arch}.{key}'" for key in _REQUIRED if get(key) is None]
    if missing:  # every one named: an architecture the budget does not know lacks several
        keys = "key" if len(missing) == 1 else "keys"
        raise ModelFileError(path, f"missing metadata {keys} {', '.join(missing)}")
    n_layers, hidden, n_heads = (int(get(key)) for key in _REQUIRED)
    check_layer_count(path, arch, n_layers, tensors)
    fields: ArchFields = {
        "arch": _HF_MODEL_TYPES.get(arch, arch),
        "n_layers": n_layers,
        "hidden_size": hidden,
        "n_heads": n_heads,
        "n_kv_heads": get("attention.head_count_kv", n_heads),
        "head_dim": get("attention.key_length") or (hidden // n_heads if n_heads > 0 else 0),
        "ffn_size": get("feed_forward_length") or get("expert_feed_forward_length") or hidden,
        "vocab_size": get("vocab_size") or _vocab_size(metadata, tensors),
        "max_ctx": get("context_length", 2048),
        "tied_embeddings": "output.weight" not in tensors,
        "qk_norm": "blk.0.attn_q_norm.weight" in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    fields.update(_sliding(metadata, arch, n_layers))
    if is_reranker_file(metadata, tensors):
        fields["reranker"] = True
    causal = get("attention.causal")
    if causal is not None and not causal:
        fields["encoder"] = True
    if get("expert_count"):
        fields.update(
            n_experts=get("expert_count"),
            n_experts_per_token=get("expert_used_count", 1),
            moe_ffn_size=get("expert_feed_forward_length", fields["ffn_size"]),
            n_shared_experts=get("expert_shared_count", 0),
            first_dense_layers=get("leading_dense_block_count", 0),
        )
        if get("expert_shared_feed_forward_length"):  # qwen2moe: one gated shared expert
            fields.update(
                shared_expert_ffn_size=get("expert_shared_feed_forward_length"),
                shared_expert_gate="blk.0.ffn_gate_inp_shexp.weight" in tensors,
            )
    if get("attention.kv_lora_rank"):
        fields.update(
            kv_lora_rank=get("attention.kv_lora_rank"),
            qk_rope_head_dim=get("rope.dimension_count"),
        )
    return fields


def arch_from_gguf(
    metadata: Mapping[str, Any], tensors: Mapping[str, Any], path: str | Path
) -> ArchSpec:
    """A GGUF header as an ArchSpec; raises ModelFileError when it can't be one."""
    fields = arch_fields_from_gguf(metadata, tensors, path)
    try:
        return ArchSpec.from_fields(fields)
    except ValueError as exc:
        raise ModelFileError(path, f"GGUF header has inconsistent numbers ({exc})") from None


def check_layer_count(
    path: str | Path, arch: str, n_layers: int, tensors: Mapping[str, Any]
) -> None:
    """block_count against the layers the blk.N tensors hold: each of 0..n-1 has some, no
    other has any (llama.cpp aborts the whole process on a block_count of 0 or a million)."""
    layers = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    key = f"'{arch}.block_count'"
    if layers and max(layers) >= n_layers:
        reason = f"{key} is {n_layers} but the file has tensors for layer {max(layers)}"
        raise ModelFileError(path, f"malformed GGUF file: {reason}")
    if len(layers) != n_layers:
        # layers is a subset of range(n_layers) here, so some layer has no tensors at all
        reason = f"{key} is {n_layers} but the file has tensors for {len(layers)} layers"
        raise ModelFileError(path, f"malformed GGUF file: {reason}")


def _vocab_size(metadata: Mapping[str, Any], tensors: Mapping[str, Any]) -> int:
    embd = tensors.get("token_embd.weight")
    if embd is not None:
        return int(embd.shape[0])  # numpy order: [vocab, hidden]
    tokens = metadata.get("tokenizer.ggml.tokens")
    return len(tokens) if tokens is not None else 0


def _sliding(metadata: Mapping[str, Any], arch: str, n_layers: int) -> ArchFields:
    window = metadata.get(f"{arch}.attention.sliding_window")
    if not window:
        return {}
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, np.ndarray | list) and len(pattern) == n_layers:  # per layer: sliding?
        return {
            "sliding_window": window,
            "sliding_layers": tuple(i for i, on in enumerate(pattern) if on),
        }
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        return {"sliding_window": window, "sliding_pattern": pattern}
    if arch in _DEFAULT_SLIDING_PATTERNS:
        return {"sliding_window": window, "sliding_pattern": _DEFAULT_SLIDING_PATTERNS[arch]}
    return {"sliding_window": window}  # every layer slides
