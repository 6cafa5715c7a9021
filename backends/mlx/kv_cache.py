"""Per-slot KV cache in preallocated MLX arrays, one pair per layer.

Keys and values live in ``[slots, kv_heads, max_ctx, head_dim]`` arrays allocated once. A forward
scatters new entries at each token's (slot, position), so slots at different positions share one
batch; a slot's length is plain bookkeeping, so rollback (speculation, prefix reuse) is a length
change and the next write overwrites. Entries past a slot's length are never read: attention masks
stop at each query's position.

MLX arrays are values: ``keys[layer][...] = k`` builds a scatter whose output takes over the old
buffer (MLX donates a buffer with no other reference), so the cache is updated in place once the
forward is evaluated. The runner evaluates the cache together with the logits every forward, so
no graph ever grows across steps.
"""

from __future__ import annotations

import mlx.core as mx


class SlotKVCache:
    def __init__(
        self,
        n_layers: int,
        slots: int,
        kv_heads: int,
        max_ctx: int,
        head_dim: int,
        dtype: mx.Dtype,
    ) -> None:
        shape = (slots, kv_heads, max_ctx, head_dim)
        # Zero-filled so masked-out reads see finite numbers, never NaN garbage.
        self.keys = [mx.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.values = [mx.zeros(shape, dtype=dtype) for _ in range(n_layers)]

    def write(
        self, layer: int, slots: mx.array, positions: mx.array, k: mx.array, v: mx.array
    ) -> None:
        """slots, positions: [T] int32; k, v: [T, kv_heads, head_dim]."""
        # Advanced indices on dims 0 and 2 put the indexed dim first: the target is [T, kv, d].
        self.keys[layer][slots, :, positions] = k
        self.values[layer][slots, :, positions] = v

    def move(
        self, slot: int, src: mx.array, dst: mx.array, cos: mx.array, signed_sin: mx.array
    ) -> None:
        """Entries at positions ``src`` of ``slot`` go to ``dst`` (both [M] int32), keys turned by
        cos/signed_sin ([M, 1, head_dim] float32, rope.py's rotate-half form) in float32. Arrays
        are values, so every read sees the cache as it was; the caller evaluates."""
        half = self.keys[0].shape[-1] // 2
        slots = mx.full(src.shape, slot, dtype=mx.int32)
        for layer in range(len(self.keys)):
            # As in write(): the indexed dim comes first, [M, kv_heads, head_dim].
            k = self.keys[layer][slots, :, src].astype(mx.float32)
            v = self.values[layer][slots, :, src]
            swapped = mx.concatenate([k[..., half:], k[..., :half]], axis=-1)
            turned = (k * cos + swapped * signed_sin).astype(self.keys[layer].dtype)
            self.keys[layer][slots, :, dst] = turned
            self.values[layer][slots, :, dst] = v

    def read(self, layer: int, slots: tuple[int, ...], kv_len: int) -> tuple[mx.array, mx.array]:
        """Keys and values of ``slots`` (ascending): [members, kv_heads, kv_len, head_dim]."""
        keys, values = self.keys[layer], self.values[layer]
        lo, hi = slots[0], slots[-1] + 1
        if hi - lo == len(slots):  # consecutive slots: one slice
            return keys[lo:hi, :, :kv_len], values[lo:hi, :, :kv_len]
        index = mx.array(slots, dtype=mx.int32)
        return keys[index, :, :kv_len], values[index, :, :kv_len]

    def arrays(self) -> list[mx.array]:
        return self.keys + self.values

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())
