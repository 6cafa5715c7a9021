"""Rotary position embedding in the rotate-half (Hugging Face / NeoX) form.

Weights arrive in Hugging Face layout (GGUF Q/K rows are un-permuted by the loader), so the two
rotated halves of each head are ``x[..., :d/2]`` and ``x[..., d/2:]``.
"""

from __future__ import annotations

import math

import torch

from localinfer.loading.model_config import ModelConfig, RopeScaling


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """[head_dim / 2] float64 angular frequencies, with the config's scaling applied."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise ValueError(f"unsupported rope scaling {scaling.kind!r}")


def _llama3_scaled(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, and the band in
    # between is interpolated smoothly (Llama 3.1 recipe).
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    config: ModelConfig, max_ctx: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed-sin tables, each [max_ctx, head_dim].

    Rotate-half RoPE is ``x * cos + cat(-x2, x1) * sin``; with the sign folded into the table
    (``-sin`` on the first half) it becomes ``x * cos + roll(x, d/2) * signed_sin``: fewer ops per
    layer, which matters when a decode step is a few thousand small ops.
    """
    positions = torch.arange(max_ctx, dtype=torch.float64)
    angles = torch.outer(positions, inverse_frequencies(config))  # [max_ctx, head_dim/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # [max_ctx, head_dim]
    signed_sin = torch.cat([-angles.sin(), angles.sin()], dim=-1)
    return cos.to(dtype=dtype, device=device), signed_sin.to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/signed_sin: [T, 1, head_dim] rows at each token's position."""
    swapped = x.roll(x.shape[-1] // 2, dims=-1)  # [x2, x1]
    return torch.addcmul(x * cos, swapped, signed_sin)
