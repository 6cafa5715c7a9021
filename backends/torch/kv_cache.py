"""A preallocated static KV cache, gpt-fast style.

Keys and values of every layer live in fixed tensors ``[slots, kv_heads, max_ctx, head_dim]``
allocated once. A forward writes new entries at their absolute positions; a slot's length is plain
bookkeeping, so rollback (speculation, prefix reuse) is a length change and the next write simply
overwrites. Entries past a slot's length are never read: attention masks stop at each query's
position. Cache reuse moves entries within a slot (``move``; the splice is kv_move.py's).
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(
        self,
        n_layers: int,
        slots: int,
        kv_heads: int,
        max_ctx: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (slots, kv_heads, max_ctx, head_dim)
        # Zero-filled so that masked-out (padding) reads see finite numbers, never NaN garbage.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_ctx = max_ctx

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """slots, positions: [T] long; k, v: [T, kv_heads, head_dim]."""
        # Advanced indices on dims 0 and 2 put the indexed dim first: the target is [T, kv, d].
        self.keys[layer][slots, :, positions] = k
        self.values[layer][slots, :, positions] = v

    def move(
        self,
        slot: int,
        src: torch.Tensor,
        dst: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
    ) -> None:
        """Entries at positions ``src`` of ``slot`` go to ``dst`` (both [M] long), every layer's
        read before its write; keys are turned by cos/signed_sin ([M, 1, head_dim] float32, the
        rotate-half form of rope.py) in float32."""
        half = self.keys[0].shape[-1] // 2
        slots = torch.full_like(src, slot)
        for keys, values in zip(self.keys, self.values, strict=True):
            # As in write(): the indexed dim comes first, [M, kv_heads, head_dim]; advanced
            # indexing copies, so overlapping ranges read the old entries.
            k = keys[slots, :, src].float()
            v = values[slots, :, src]
            turned = torch.addcmul(k * cos, k.roll(half, dims=-1), signed_sin)
            keys[slots, :, dst] = turned.to(keys.dtype)
            values[slots, :, dst] = v

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.keys + self.values)
