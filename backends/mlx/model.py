"""Llama-family decoder (llama, mistral, qwen2, qwen3) in MLX over packed tokens and a slot cache.

Written here rather than reusing mlx-lm's model files: mlx-lm's models take ``[batch, seq]``
inputs with one cache offset per row (left-padded batches), while the engine's batches are ragged
(a 300-token prefill chunk beside seven one-token decodes, each slot at its own position). Packing
every token into ``[T, hidden]`` keeps the matrix products, where decoding spends its time, at one
call per weight for the whole batch, and only attention is split per group (batch_layout.py). The
four architectures differ only in small switches (qkv bias, q/k norm, sliding window), so one file
covers them; the weights (weights.py) already hide float vs quantized vs native GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from localinfer.backends.mlx.batch_layout import AttentionGroup, BatchLayout
from localinfer.backends.mlx.kv_cache import SlotKVCache
from localinfer.backends.mlx.rope import apply_rope, rope_tables
from localinfer.backends.mlx.weights import ModelWeights
from localinfer.loading.model_config import ModelConfig

MLX_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


class LlamaModel:
    def __init__(
        self, config: ModelConfig, weights: ModelWeights, max_ctx: int, dtype: mx.Dtype
    ) -> None:
        self.config = config
        self.weights = weights
        self.dtype = dtype
        self.scale = config.head_dim**-0.5
        self.cos, self.sin = rope_tables(config, max_ctx, dtype)  # [max_ctx, head_dim] each
        mx.eval(self.cos, self.sin)

    def hidden_states(self, layout: BatchLayout, cache: SlotKVCache) -> mx.array:
        """Runs every layer over the packed tokens, writing K/V into the cache; returns
        [T, hidden] (before the final norm)."""
        c, w = self.config, self.weights
        n = len(layout.tokens)
        nh, nkv, hd, eps = c.n_heads, c.n_kv_heads, c.head_dim, c.rms_eps
        slots = mx.array(layout.slots)  # [T]
        positions = mx.array(layout.positions)  # [T]
        cos = self.cos[positions][:, None, :]  # [T, 1, head_dim]
        sin = self.sin[positions][:, None, :]
        groups = [_GroupArrays.build(g) for g in layout.groups]
        x = w.embed.rows(mx.array(layout.tokens), self.dtype)  # [T, hidden]
        for i, layer in enumerate(w.layers):
            h = mx.fast.rms_norm(x, layer.input_norm, eps)
            q, k, v = layer.qkv(h)
            q = q.reshape(n, nh, hd)
            k = k.reshape(n, nkv, hd)
            v = v.reshape(n, nkv, hd)
            if layer.q_norm is not None and layer.k_norm is not None:
                # qwen3: per-head RMSNorm on q and k before RoPE
                q = mx.fast.rms_norm(q, layer.q_norm, eps)
                k = mx.fast.rms_norm(k, layer.k_norm, eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            cache.write(i, slots, positions, k, v)
            attn = self._attention(q, i, cache, groups, layer.sliding)  # [T, heads * head_dim]
            x = x + layer.o(attn)
            h = mx.fast.rms_norm(x, layer.post_norm, eps)
            gate, up = layer.gate_up(h)
            x = x + layer.down(nn.silu(gate) * up)
        return x

    def logits(self, hidden: mx.array) -> mx.array:
        """[R, hidden] -> [R, vocab] float32 (final norm + LM head on the wanted rows only)."""
        h = mx.fast.rms_norm(hidden, self.weights.norm, self.config.rms_eps)
        return self.weights.lm_head(h).astype(mx.float32)

    def _attention(
        self,
        q: mx.array,
        layer: int,
        cache: SlotKVCache,
        groups: list[_GroupArrays],
        sliding: bool,
    ) -> mx.array:
        """q: [T, heads, head_dim] with RoPE applied; the layer's new K/V already written.
        Returns [T, heads * head_dim] in packed order."""
        heads, hd = q.shape[1], q.shape[2]
        outs = []
        for ga in groups:
            g = ga.group
            members = len(g.slots)
            if ga.gather is None:
                qg = q[g.token_start : g.token_end]  # [members * q_len, heads, hd]
            else:
                qg = q[ga.gather]
            qg = qg.reshape(members, g.q_len, heads, hd).transpose(0, 2, 1, 3)
            keys, values = cache.read(layer, g.slots, g.kv_len)  # [members, kv, kv_len, hd]
            mask = ga.sliding_mask if sliding else ga.mask
            o = mx.fast.scaled_dot_product_attention(
                qg, keys, values, scale=self.scale, mask=mask
            )  # [members, heads, q_len, hd]
            o = o.transpose(0, 2, 1, 3).reshape(members * g.q_len, heads * hd)
            if ga.scatter is not None:
                o = o[ga.scatter]
            outs.append(o)
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)


@dataclass(slots=True)
class _GroupArrays:
    """An AttentionGroup's index and mask arrays, moved to MLX once per forward."""

    group: AttentionGroup
    gather: mx.array | None  # [members * q_len] int32 packed rows; None when dense
    scatter: mx.array | None  # [Tg] int32 padded rows; None when dense
    mask: mx.array | None  # [members, 1, q_len, kv_len] bool; None: every key visible
    sliding_mask: mx.array | None

    @classmethod
    def build(cls, g: AttentionGroup) -> _GroupArrays:
        def arr(a: np.ndarray | None) -> mx.array | None:
            return None if a is None else mx.array(a)

        dense = g.dense
        return cls(
            g,
            None if dense else arr(g.gather_rows),
            None if dense else arr(g.scatter_rows),
            arr(g.mask),
            arr(g.sliding_mask),
        )
