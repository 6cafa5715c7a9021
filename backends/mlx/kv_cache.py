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

``MLXKVCache`` is ``MLXRunner.kv_cache`` (backends/base.py's KVCache): a prefix copied between
slots as a slice copy, a slot's rows to host bytes and back, cached entries moved by a splice;
what is not MLX is backends/static_kv.py's. Payload rows cross to numpy as unsigned integers of
the element's width (numpy has no bfloat16). Every write below builds a scatter into the cache
arrays, evaluated before returning so that no graph is left pending.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from localinfer.backends.kv_splice import CellMove, Forward, cell_indices, move_tables
from localinfer.backends.slot_lengths import SlotLengths
from localinfer.backends.static_kv import StaticCacheShape, StaticKV
from localinfer.loading.model_config import ModelConfig

_BITS = {2: (mx.uint16, np.uint16), 4: (mx.uint32, np.uint32)}  # element bytes -> raw types


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


def move_cells(
    cache: SlotKVCache, slot: int, moves: Sequence[CellMove], inv_freq: np.ndarray
) -> None:
    """Every move's entries of ``slot`` to their destinations, keys turned by their deltas,
    evaluated before returning. ``inv_freq``: [head_dim / 2] float64."""
    src, dst = cell_indices(moves)
    cos, signed_sin = move_tables(moves, inv_freq)  # [M, head_dim] float64
    cache.move(
        slot,
        mx.array(src.astype(np.int32)),
        mx.array(dst.astype(np.int32)),
        mx.array(cos.astype(np.float32))[:, None],  # [M, 1, head_dim]: broadcast over kv heads
        mx.array(signed_sin.astype(np.float32))[:, None],
    )
    mx.eval(cache.arrays())


class MLXKVCache(StaticKV):
    """``MLXRunner.kv_cache``: KVCache over the runner's SlotKVCache (module doc)."""

    def __init__(
        self,
        cache: SlotKVCache,
        norm: mx.array,
        device: mx.Device,
        quant: str,
        config: ModelConfig,
        lengths: SlotLengths,
        forward: Forward,
    ) -> None:
        """``norm``: the final norm's weight (its bytes are part of the layout key); ``device``:
        the stream every operation runs on; ``quant``, ``lengths``, ``forward``: the runner's."""
        keys = cache.keys[0]  # [slots, kv_heads, max_ctx, head_dim]
        _, kv_heads, max_ctx, head_dim = keys.shape
        shape = StaticCacheShape(
            "mlx",
            str(keys.dtype).removeprefix("mlx.core."),
            len(cache.keys),
            kv_heads,
            head_dim,
            keys.dtype.size,
            quant,
            config,
        )
        super().__init__(shape, lengths, max_ctx, forward)
        self._cache = cache
        self._norm = norm
        self._device = device
        self._raw, self._host = _BITS[keys.dtype.size]  # unsigned types as wide as an element

    def _norm_bytes(self) -> bytes:
        return np.array(self._norm.astype(mx.float32)).tobytes()

    def _copy_rows(self, src: int, dst: int, n_tokens: int) -> None:
        cache = self._cache
        with mx.stream(self._device):
            for tables in (cache.keys, cache.values):
                for table in tables:  # [slots, kv_heads, max_ctx, head_dim]
                    table[dst, :, :n_tokens] = table[src, :, :n_tokens]
            mx.eval(cache.arrays())

    def _read_rows(self, slot: int, n_tokens: int) -> bytes:
        cache = self._cache
        with mx.stream(self._device):
            pairs = zip(cache.keys, cache.values, strict=True)
            rows = [t[slot, :, :n_tokens] for pair in pairs for t in pair]
            host = np.array(mx.stack(rows).view(self._raw))  # [layers * 2, kv_heads, n, head_dim]
        return host.tobytes()

    def _write_rows(self, slot: int, payload: bytes, n_tokens: int) -> None:
        cache, n = self._cache, n_tokens
        host = np.frombuffer(payload, dtype=self._host).reshape(self.shape.payload_shape(n))
        with mx.stream(self._device):
            rows = mx.array(host).view(cache.keys[0].dtype)
            for i, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
                keys[slot, :, :n] = rows[i, 0]
                values[slot, :, :n] = rows[i, 1]
            mx.eval(cache.arrays())

    def _move_cells(self, slot: int, moves: Sequence[CellMove], inv_freq: np.ndarray) -> None:
        with mx.stream(self._device):
            move_cells(self._cache, slot, moves, inv_freq)

    def _release(self) -> None:
        del self._cache, self._norm
