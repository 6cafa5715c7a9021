"""Rotary position embedding, rotate-half (Hugging Face / NeoX) form, from precomputed tables.

All weights reach the model in Hugging Face layout (natively loaded GGUF Q/K rows are un-permuted
in weights.py), so one RoPE form serves every file. The tables (backends/rope_tables.py) are
gathered per token at its absolute position: a ragged batch has a different position on every
row, which a table gather handles with no per-slot offsets.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localinfer.backends import rope_tables as tables
from localinfer.loading.model_config import ModelConfig


def rope_tables(config: ModelConfig, max_ctx: int, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """cos and signed-sin tables, each [max_ctx, head_dim] (see backends/rope_tables.py)."""
    cos, signed_sin = tables.rope_tables(config, max_ctx)
    return (
        mx.array(cos.astype(np.float32)).astype(dtype),
        mx.array(signed_sin.astype(np.float32)).astype(dtype),
    )


def apply_rope(x: mx.array, cos: mx.array, signed_sin: mx.array) -> mx.array:
    """x: [T, heads, head_dim]; cos/signed_sin: [T, 1, head_dim] rows at each token's position."""
    half = x.shape[-1] // 2
    swapped = mx.concatenate([x[..., half:], x[..., :half]], axis=-1)  # [x2, x1]
    return x * cos + swapped * signed_sin
