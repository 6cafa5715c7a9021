"""A preallocated static KV cache, gpt-fast style, and the runner's public view of it.

Keys and values of every layer live in fixed tensors ``[slots, kv_heads, max_ctx, head_dim]``
allocated once (``StaticKVCache``). A forward writes new entries at their absolute positions; a
slot's length is plain bookkeeping, so rollback (speculation, prefix reuse) is a length change and
the next write simply overwrites. Entries past a slot's length are never read: attention masks
stop at each query's position. Cache reuse moves entries within a slot (``move``).

``TorchKVCache`` is ``TorchRunner.kv_cache`` (backends/base.py's KVCache): a prefix copied between
slots as a slice copy, a slot's rows to host bytes and back, cached entries moved by a splice;
what is not torch is backends/static_kv.py's. The tensors are written in place, never replaced:
the native kernels hold their raw addresses.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from localinfer.backends.kv_splice import CellMove, Forward, cell_indices, move_tables
from localinfer.backends.slot_lengths import SlotLengths
from localinfer.backends.static_kv import StaticCacheShape, StaticKV
from localinfer.loading.model_config import ModelConfig


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


def move_cells(
    cache: StaticKVCache, slot: int, moves: Sequence[CellMove], inv_freq: np.ndarray
) -> None:
    """Every move's entries of ``slot`` to their destinations, keys turned by their deltas.
    ``inv_freq``: [head_dim / 2] float64 on the CPU (rope_tables.inverse_frequencies)."""
    device = cache.keys[0].device
    src, dst = cell_indices(moves)
    cos, signed_sin = move_tables(moves, inv_freq)  # [M, head_dim] float64

    def put(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device)

    with torch.inference_mode():
        cache.move(
            slot,
            put(src),
            put(dst),
            put(cos).float()[:, None],  # [M, 1, head_dim]: broadcast over kv heads
            put(signed_sin).float()[:, None],
        )


class TorchKVCache(StaticKV):
    """``TorchRunner.kv_cache``: KVCache over the runner's StaticKVCache (module doc)."""

    def __init__(
        self,
        cache: StaticKVCache,
        norm: torch.Tensor,
        quant: str,
        config: ModelConfig,
        lengths: SlotLengths,
        forward: Forward,
    ) -> None:
        """``norm``: the final norm's weight (its bytes are part of the layout key); ``quant``:
        the runner's weight form; ``lengths`` and ``forward``: the runner's (static_kv.py)."""
        keys = cache.keys[0]  # [slots, kv_heads, max_ctx, head_dim]
        shape = StaticCacheShape(
            "torch",
            str(keys.dtype).removeprefix("torch."),
            len(cache.keys),
            keys.shape[1],
            keys.shape[3],
            keys.element_size(),
            quant,
            config,
        )
        super().__init__(shape, lengths, cache.max_ctx, forward)
        self._cache = cache
        self._norm = norm

    def _norm_bytes(self) -> bytes:
        return self._norm.detach().float().cpu().numpy().tobytes()

    def _copy_rows(self, src: int, dst: int, n_tokens: int) -> None:
        cache = self._cache
        with torch.inference_mode():
            for table in cache.keys + cache.values:  # each [slots, kv_heads, max_ctx, head_dim]
                table[dst, :, :n_tokens].copy_(table[src, :, :n_tokens])

    def _read_rows(self, slot: int, n_tokens: int) -> bytes:
        cache = self._cache
        host = torch.empty(self.shape.payload_shape(n_tokens), dtype=cache.keys[0].dtype)
        on_cuda = cache.keys[0].device.type == "cuda"
        if on_cuda:
            host = host.pin_memory()  # so the device->host copies can run without staging
        with torch.inference_mode():
            for i, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
                host[i, 0].copy_(keys[slot, :, :n_tokens], non_blocking=on_cuda)
                host[i, 1].copy_(values[slot, :, :n_tokens], non_blocking=on_cuda)
            if on_cuda:
                torch.cuda.synchronize(cache.keys[0].device)
        return host.view(torch.uint8).numpy().tobytes()

    def _write_rows(self, slot: int, payload: bytes, n_tokens: int) -> None:
        cache = self._cache
        with warnings.catch_warnings():
            # The buffer is read-only bytes; it is only ever read (copied into the cache).
            warnings.filterwarnings("ignore", message=".*not writable.*")
            raw = torch.frombuffer(payload, dtype=torch.uint8)
        rows = raw.view(cache.keys[0].dtype).view(self.shape.payload_shape(n_tokens))
        n = n_tokens
        with torch.inference_mode():
            for i, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
                keys[slot, :, :n].copy_(rows[i, 0])
                values[slot, :, :n].copy_(rows[i, 1])

    def _move_cells(self, slot: int, moves: Sequence[CellMove], inv_freq: np.ndarray) -> None:
        move_cells(self._cache, slot, moves, inv_freq)

    def _release(self) -> None:
        del self._cache, self._norm
