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
        x = self.weights.embed_rows(tokens)  # [T, hidden]
        rope = self.rope_rows(positions)
        for i, layer in enumerate(self.weights.layers):
            q = self.attention_inputs(i, x, rope, slots, positions, cache)
            attn = grouped_attention(q, cache.keys[i], cache.values[i], groups, layer.sliding)
            x = self.layer_output(i, x, attn)
        return x

    def rope_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at each token's position: [T, 1, head_dim] each."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    def attention_inputs(
        self,
        i: int,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        positions: torch.Tensor,
        cache: StaticKVCache,
    ) -> torch.Tensor:
        """Layer ``i`` up to attention: writes the tokens' K/V into the cache and returns their
        queries [T, heads, head_dim], RoPE applied. The halves of a layer are separate so that
        a CUDA graph can hold them and leave attention, whose shapes change every step, out
        (cuda_graphs.py)."""
        c, layer = self.config, self.weights.layers[i]
        n, nh, nkv, eps = x.shape[0], c.n_heads, c.n_kv_heads, c.rms_eps
        cos, sin = rope  # rope_rows(positions)
        h = rms_norm(x, layer.input_norm, eps)
        qkv = self.linear(h, layer.qkv, layer.qkv_bias)  # [T, (heads + 2 * kv_heads) * d]
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
        return q

    def layer_output(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Layer ``i`` after attention: the residual stream [T, hidden] it passes on, from its
        input ``x`` and the attention output ``attn`` [T, heads * head_dim]."""
        layer, linear, eps = self.weights.layers[i], self.linear, self.config.rms_eps
        x = x + linear(attn, layer.o)  # [T, hidden]
        h = rms_norm(x, layer.post_norm, eps)
        gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)  # [T, ffn] each
        return x + linear(F.silu(gate) * up, layer.down)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, vocab] float32 (final norm + LM head on the wanted rows only)."""
        h = rms_norm(hidden, self.weights.norm, self.config.rms_eps)
        return self.lm_linear(h, self.weights.lm_head).float()
