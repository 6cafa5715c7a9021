"""Llama-family decoder (llama, mistral, qwen2, qwen3) over packed tokens and a static KV cache.

One forward runs every token of a ragged batch through each layer together: the matrix products
see ``[T, hidden]`` whatever mix of prefill chunks and decode steps the batch holds, and only
attention is split by group (see backends/ragged_batch.py and attention.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localinfer.backends.torch.attention import GroupTensors, grouped_attention
from localinfer.backends.torch.kv_cache import StaticKVCache
from localinfer.backends.torch.rope import apply_rope, rope_tables
from localinfer.backends.torch.weights import ModelWeights
from localinfer.loading.model_config import ModelConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 (weight is float32), returned in x's dtype."""
    return F.rms_norm(x.float(), weight.shape, weight, eps).to(x.dtype)


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        max_ctx: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.config = config
        self.weights = weights
        self.linear = weights.linear
        # The LM head is dense when it is the (tied) embedding table itself.
        self.lm_linear = weights.lm_linear
        # [max_ctx, head_dim] each (cos, signed sin), gathered per token at its position.
        self.cos, self.sin = rope_tables(config, max_ctx, dtype, device)

    @property
    def q_per_kv(self) -> int:
        return self.config.n_heads // self.config.n_kv_heads

    @property
    def sliding_window(self) -> int | None:
        return self.config.sliding_window if self.config.sliding_layers else None

    def hidden_states(
        self,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        groups: list[GroupTensors],
        cache: StaticKVCache,
    ) -> torch.Tensor:
        """tokens, slots, positions: [T] long. Writes K/V into the cache; returns [T, hidden]
        (before the final norm)."""
        c, w, linear = self.config, self.weights, self.linear
        n = tokens.shape[0]
        eps = c.rms_eps
        nh, nkv = c.n_heads, c.n_kv_heads
        cos = self.cos[positions][:, None, :]  # [T, 1, head_dim]
        sin = self.sin[positions][:, None, :]
        x = w.embed_rows(tokens)  # [T, hidden]
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.input_norm, eps)
            qkv = linear(h, layer.qkv, layer.qkv_bias)  # [T, (heads + 2 * kv_heads) * head_dim]
            qkv = qkv.view(n, nh + 2 * nkv, c.head_dim)
            v = qkv[:, nh + nkv :]  # [T, kv_heads, head_dim]
            if layer.q_norm is not None and layer.k_norm is not None:
                # qwen3: per-head RMSNorm on q and k before RoPE
                q = apply_rope(rms_norm(qkv[:, :nh], layer.q_norm, eps), cos, sin)
                k = apply_rope(rms_norm(qkv[:, nh : nh + nkv], layer.k_norm, eps), cos, sin)
            else:
                qk = apply_rope(qkv[:, : nh + nkv], cos, sin)  # q and k heads rotated at once
                q, k = qk[:, :nh], qk[:, nh:]
            cache.write(i, slots, positions, k, v)
            attn = grouped_attention(q, cache.keys[i], cache.values[i], groups, layer.sliding)
            x = x + linear(attn, layer.o)  # [T, hidden]
            h = rms_norm(x, layer.post_norm, eps)
            gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)  # [T, ffn] each
            x = x + linear(F.silu(gate) * up, layer.down)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, vocab] float32 (final norm + LM head on the wanted rows only)."""
        h = rms_norm(hidden, self.weights.norm, self.config.rms_eps)
        return self.lm_linear(h, self.weights.lm_head).float()
