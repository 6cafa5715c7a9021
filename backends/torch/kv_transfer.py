"""``KVTransfer`` (backends/base.py) on the torch runner's static cache: a prefix copied between
slots as a slice copy, and a slot's rows to host bytes and back.

Payload: for every layer in order, its K rows then its V rows ``[0, n)`` of the slot, each
``[kv_heads, n, head_dim]`` in the cache's dtype, raw (bf16/fp16 as their 16-bit patterns). The
tensors are written in place, never replaced: the native kernels hold their raw addresses."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from localinfer.backends.base import KVSnapshot
from localinfer.backends.kv_transfer_checks import (
    check_copy,
    check_restore,
    check_snapshot,
    remembered_layout,
    static_cache_layout,
)
from localinfer.backends.torch.kv_cache import StaticKVCache

if TYPE_CHECKING:
    from localinfer.backends.torch.runner import TorchRunner


def kv_layout(runner: TorchRunner) -> str:
    """The runner's snapshot compatibility key: cache dtype and shape, weight form, model. Worked
    out once per runner (it copies the final norm's weights to the host), then remembered."""
    return remembered_layout(runner, lambda: _layout(runner))


def _layout(runner: TorchRunner) -> str:
    keys = runner._cache.keys[0]  # [slots, kv_heads, max_ctx, head_dim]
    norm = runner._model.weights.norm.detach().float().cpu().numpy()
    return static_cache_layout(
        "torch",
        str(keys.dtype).removeprefix("torch."),
        tuple(keys.shape),
        len(runner._cache.keys),
        runner.info.quant,
        runner.model_config,
        norm.tobytes(),
    )


def copy_prefix(runner: TorchRunner, src: int, dst: int, n_tokens: int) -> None:
    """Every layer's K/V rows ``[0, n_tokens)`` of ``src`` into ``dst``, same positions."""
    check_copy(runner._lengths, src, dst, n_tokens)
    cache = runner._cache
    with torch.inference_mode():
        for table in cache.keys + cache.values:  # each [slots, kv_heads, max_ctx, head_dim]
            table[dst, :, :n_tokens].copy_(table[src, :, :n_tokens])
    runner._lengths[dst] = n_tokens


def snapshot(runner: TorchRunner, slot: int, n_tokens: int) -> KVSnapshot:
    """The slot's rows ``[0, n_tokens)`` of every layer, copied to host memory as raw bytes."""
    check_snapshot(runner._lengths, slot, n_tokens)
    cache = runner._cache
    host = torch.empty(_payload_shape(cache, n_tokens), dtype=cache.keys[0].dtype)
    on_cuda = cache.keys[0].device.type == "cuda"
    if on_cuda:
        host = host.pin_memory()  # so the device->host copies can run without staging
    with torch.inference_mode():
        for i, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
            host[i, 0].copy_(keys[slot, :, :n_tokens], non_blocking=on_cuda)
            host[i, 1].copy_(values[slot, :, :n_tokens], non_blocking=on_cuda)
        if on_cuda:
            torch.cuda.synchronize(cache.keys[0].device)
    payload = host.view(torch.uint8).numpy().tobytes()
    return KVSnapshot(layout=kv_layout(runner), n_tokens=n_tokens, payload=payload)


def restore(runner: TorchRunner, slot: int, snap: KVSnapshot) -> None:
    """The snapshot's rows written at positions ``[0, n)`` of ``slot``; the slot then holds
    exactly them."""
    cache = runner._cache
    shape = _payload_shape(cache, snap.n_tokens)
    element = cache.keys[0].element_size()
    check_restore(
        runner._lengths,
        slot,
        snap,
        kv_layout(runner),
        runner.config.max_ctx,
        int(np.prod(shape)) * element,
    )
    with warnings.catch_warnings():
        # The buffer is read-only bytes; it is only ever read (copied into the cache).
        warnings.filterwarnings("ignore", message=".*not writable.*")
        rows = torch.frombuffer(snap.payload, dtype=torch.uint8)
    rows = rows.view(cache.keys[0].dtype).view(shape)
    n = snap.n_tokens
    with torch.inference_mode():
        for i, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
            keys[slot, :, :n].copy_(rows[i, 0])
            values[slot, :, :n].copy_(rows[i, 1])
    runner._lengths[slot] = n


def _payload_shape(cache: StaticKVCache, n_tokens: int) -> tuple[int, ...]:
    _, kv_heads, _, head_dim = cache.keys[0].shape
    return (len(cache.keys), 2, kv_heads, n_tokens, head_dim)  # [layers, k|v, kv, n, d]
