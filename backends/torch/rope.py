"""Rotary position embedding in the rotate-half (Hugging Face / NeoX) form.

Weights arrive in Hugging Face layout (GGUF Q/K rows are un-permuted by the loader), so the two
rotated halves of each head are ``x[..., :d/2]`` and ``x[..., d/2:]``. The tables come from
backends/rope_tables.py (float64 numpy, shared with the MLX runner).
"""

from __future__ import annotations

import torch

from localinfer.backends import rope_tables as tables
from localinfer.loading.model_config import ModelConfig


def rope_tables(
    config: ModelConfig, max_ctx: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed-sin tables, each [max_ctx, head_dim] (see backends/rope_tables.py)."""
    cos, signed_sin = tables.rope_tables(config, max_ctx)
    return (
        torch.from_numpy(cos).to(dtype=dtype, device=device),
        torch.from_numpy(signed_sin).to(dtype=dtype, device=device),
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/signed_sin: [T, 1, head_dim] rows at each token's position."""
    swapped = x.roll(x.shape[-1] // 2, dims=-1)  # [x2, x1]
    return torch.addcmul(x * cos, swapped, signed_sin)
