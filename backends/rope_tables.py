"""Rotary position tables (rotate-half form), computed once in float64 numpy for every runner.

Each framework's runner converts these to its own arrays; the frequency recipes (plain, linear,
Llama 3.1 scaling) live only here.
"""

from __future__ import annotations

import math

import numpy as np

from localinfer.loading.model_config import ModelConfig, RopeScaling


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """[head_dim / 2] float64 angular frequencies, with the config's scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise ValueError(f"unsupported rope scaling {scaling.kind!r}")


def _llama3_scaled(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    # (the Llama 3.1 recipe).
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def rope_tables(config: ModelConfig, max_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed-sin tables, each [max_ctx, head_dim] float64.

    Rotate-half RoPE is ``x * cos + cat(-x2, x1) * sin``; folding the sign into the table
    (``-sin`` on the first half) leaves ``x * cos + cat(x2, x1) * signed_sin``: fewer ops per
    layer, which matters when a decode step is a few thousand small ops.
    """
    angles = np.outer(np.arange(max_ctx, dtype=np.float64), inverse_frequencies(config))
    cos = np.concatenate([np.cos(angles), np.cos(angles)], axis=-1)  # [max_ctx, head_dim]
    signed_sin = np.concatenate([-np.sin(angles), np.sin(angles)], axis=-1)
    return cos, signed_sin
