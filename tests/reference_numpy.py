"""An independent numpy forward pass of the Llama family, written from the math for readability.

Full sequence, no cache, one head at a time: slow and plain on purpose, so it can serve as the
reference that the fast runners are compared against. Shares nothing with backends/ but the
weight names and the ModelConfig.

    logits = reference_logits(config, weights, token_ids)   # [n, vocab]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from localinfer.loading.model import WeightSource
from localinfer.loading.model_config import ModelConfig


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rope_frequencies(config: ModelConfig) -> np.ndarray:
    """theta_i = base^(-2i/d) for i < d/2, then the config's scaling (linear or Llama 3)."""
    d = config.head_dim
    freqs = np.array([config.rope_theta ** (-2.0 * i / d) for i in range(d // 2)])
    s = config.rope_scaling
    if s is None:
        return freqs
    if s.kind == "linear":
        return freqs / s.factor
    assert s.kind == "llama3", s.kind
    out = []
    for f in freqs:
        wavelength = 2 * math.pi / f
        if wavelength < s.original_max_position_embeddings / s.high_freq_factor:
            out.append(f)  # high frequency: unchanged
        elif wavelength > s.original_max_position_embeddings / s.low_freq_factor:
            out.append(f / s.factor)  # low frequency: slowed down by the factor
        else:  # in between: blend the two
            t = (s.original_max_position_embeddings / wavelength - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            out.append((1 - t) * f / s.factor + t * f)
    return np.array(out)


def rotate(vec: np.ndarray, position: int, freqs: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of one head vector [d]: pair element i with element i + d/2."""
    half = vec.shape[0] // 2
    angle = position * freqs  # [d/2]
    a, b = vec[:half], vec[half:]
    return np.concatenate(
        [a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle)]
    )


def reference_logits(
    config: ModelConfig,
    weights: WeightSource,
    token_ids: Sequence[int],
    dtype: type = np.float64,
) -> np.ndarray:
    """Teacher-forced logits [len(token_ids), vocab] of a causal decoder, positions 0..n-1."""
    c = config
    # gemma3 differs (scaled embeddings, extra norms, GELU, local RoPE base): not covered here.
    assert c.arch in ("llama", "mistral", "qwen2", "qwen3"), c.arch

    def w(name: str) -> np.ndarray:
        return weights.get(name).astype(dtype)

    n, d = len(token_ids), c.head_dim
    freqs = rope_frequencies(c)
    group = c.n_heads // c.n_kv_heads
    x = w("model.embed_tokens.weight")[list(token_ids)]  # [n, hidden]

    for layer in range(c.n_layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w(p + "input_layernorm.weight"), c.rms_eps)
        q = h @ w(p + "self_attn.q_proj.weight").T  # [n, heads * d]
        k = h @ w(p + "self_attn.k_proj.weight").T  # [n, kv_heads * d]
        v = h @ w(p + "self_attn.v_proj.weight").T
        if c.attention_bias:
            q = q + w(p + "self_attn.q_proj.bias")
            k = k + w(p + "self_attn.k_proj.bias")
            v = v + w(p + "self_attn.v_proj.bias")
        q = q.reshape(n, c.n_heads, d)
        k = k.reshape(n, c.n_kv_heads, d)
        v = v.reshape(n, c.n_kv_heads, d)
        if c.qk_norm:
            q = rms_norm(q, w(p + "self_attn.q_norm.weight"), c.rms_eps)
            k = rms_norm(k, w(p + "self_attn.k_norm.weight"), c.rms_eps)
        for t in range(n):
            q[t] = np.stack([rotate(q[t, hd], t, freqs) for hd in range(c.n_heads)])
            k[t] = np.stack([rotate(k[t, hd], t, freqs) for hd in range(c.n_kv_heads)])

        # Query i sees key j when j <= i, and within the last `window` positions on
        # sliding-window layers.
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        visible = j <= i
        if c.sliding_window is not None and layer in c.sliding_layers:
            visible &= i - j < c.sliding_window
        attn = np.zeros((n, c.n_heads, d), dtype=dtype)
        for head in range(c.n_heads):
            kv_head = head // group  # query heads share KV heads in consecutive groups
            scores = q[:, head] @ k[:, kv_head].T / math.sqrt(d)  # [n, n]
            scores = np.where(visible, scores, -np.inf)
            attn[:, head] = softmax(scores) @ v[:, kv_head]
        x = x + attn.reshape(n, c.n_heads * d) @ w(p + "self_attn.o_proj.weight").T

        h = rms_norm(x, w(p + "post_attention_layernorm.weight"), c.rms_eps)
        gate = h @ w(p + "mlp.gate_proj.weight").T
        up = h @ w(p + "mlp.up_proj.weight").T
        x = x + (silu(gate) * up) @ w(p + "mlp.down_proj.weight").T

    x = rms_norm(x, w("model.norm.weight"), c.rms_eps)
    head_name = "model.embed_tokens.weight" if c.tied_embeddings else "lm_head.weight"
    return x @ w(head_name).T
