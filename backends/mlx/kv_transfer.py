"""``KVTransfer`` (backends/base.py) on the MLX runner's slot cache: a prefix copied between slots
as a slice copy, and a slot's rows to host bytes and back.

Payload: ``[layers, k|v, kv_heads, n, head_dim]`` in the cache's dtype, raw (bf16/fp16 as their
16-bit patterns: numpy has no bfloat16, so rows cross as unsigned integers of the same width).
MLX arrays are values: every write below builds a scatter into the cache arrays, evaluated before
returning so that no graph is left pending (kv_cache.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from localinfer.backends.base import KVSnapshot
from localinfer.backends.kv_transfer_checks import (
    check_copy,
    check_restore,
    check_snapshot,
    remembered_layout,
    static_cache_layout,
)
from localinfer.backends.mlx.kv_cache import SlotKVCache

if TYPE_CHECKING:
    from localinfer.backends.mlx.runner import MLXRunner

_BITS = {2: (mx.uint16, np.uint16), 4: (mx.uint32, np.uint32)}  # element bytes -> raw types


class MLXTransferMethods:
    """``KVTransfer`` on MLXRunner (mixed into it): each method checks that the runner is open and
    hands over to this module's functions."""

    def kv_layout(self: MLXRunner) -> str:  # type: ignore[misc]
        self._check_open()
        return kv_layout(self)

    def copy_prefix(self: MLXRunner, src: int, dst: int, n_tokens: int) -> None:  # type: ignore[misc]
        self._check_open()
        copy_prefix(self, src, dst, n_tokens)

    def snapshot(self: MLXRunner, slot: int, n_tokens: int) -> KVSnapshot:  # type: ignore[misc]
        self._check_open()
        return snapshot(self, slot, n_tokens)

    def restore(self: MLXRunner, slot: int, snap: KVSnapshot) -> None:  # type: ignore[misc]
        self._check_open()
        restore(self, slot, snap)


def kv_layout(runner: MLXRunner) -> str:
    """The runner's snapshot compatibility key: cache dtype and shape, weight form, model. Worked
    out once per runner (it copies the final norm's weights to the host), then remembered."""
    return remembered_layout(runner, lambda: _layout(runner))


def _layout(runner: MLXRunner) -> str:
    keys = runner._cache.keys[0]  # [slots, kv_heads, max_ctx, head_dim]
    norm = np.array(runner._model.weights.norm.astype(mx.float32))
    return static_cache_layout(
        "mlx",
        str(keys.dtype).removeprefix("mlx.core."),
        tuple(keys.shape),
        len(runner._cache.keys),
        runner.info.quant,
        runner.model_config,
        norm.tobytes(),
    )


def copy_prefix(runner: MLXRunner, src: int, dst: int, n_tokens: int) -> None:
    """Every layer's K/V rows ``[0, n_tokens)`` of ``src`` into ``dst``, same positions."""
    check_copy(runner._lengths, src, dst, n_tokens)
    cache = runner._cache
    with mx.stream(runner.device):
        for tables in (cache.keys, cache.values):
            for table in tables:  # [slots, kv_heads, max_ctx, head_dim]
                table[dst, :, :n_tokens] = table[src, :, :n_tokens]
        mx.eval(cache.arrays())
    runner._lengths[dst] = n_tokens


def snapshot(runner: MLXRunner, slot: int, n_tokens: int) -> KVSnapshot:
    """The slot's rows ``[0, n_tokens)`` of every layer, copied to host memory as raw bytes."""
    check_snapshot(runner._lengths, slot, n_tokens)
    cache = runner._cache
    raw, _ = _raw_types(cache)
    with mx.stream(runner.device):
        pairs = zip(cache.keys, cache.values, strict=True)
        rows = [t[slot, :, :n_tokens] for pair in pairs for t in pair]
        host = np.array(mx.stack(rows).view(raw))  # [layers * 2, kv_heads, n, head_dim]
    return KVSnapshot(layout=kv_layout(runner), n_tokens=n_tokens, payload=host.tobytes())


def restore(runner: MLXRunner, slot: int, snap: KVSnapshot) -> None:
    """The snapshot's rows written at positions ``[0, n)`` of ``slot``; the slot then holds
    exactly them."""
    cache = runner._cache
    _, host_type = _raw_types(cache)
    n = snap.n_tokens
    _, kv_heads, _, head_dim = cache.keys[0].shape
    shape = (len(cache.keys), 2, kv_heads, n, head_dim)
    size = int(np.prod(shape)) * np.dtype(host_type).itemsize
    check_restore(runner._lengths, slot, snap, kv_layout(runner), runner.config.max_ctx, size)
    host = np.frombuffer(snap.payload, dtype=host_type).reshape(shape)
    with mx.stream(runner.device):
        rows = mx.array(host).view(cache.keys[0].dtype)
        for i, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
            keys[slot, :, :n] = rows[i, 0]
            values[slot, :, :n] = rows[i, 1]
        mx.eval(cache.arrays())
    runner._lengths[slot] = n


def _raw_types(cache: SlotKVCache) -> tuple[mx.Dtype, type]:
    """The unsigned integer types (MLX, numpy) as wide as the cache's elements."""
    return _BITS[cache.keys[0].dtype.size]
