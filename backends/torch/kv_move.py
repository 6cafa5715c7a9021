"""Cache reuse on the torch runner (``KVSplicer.splice``): cached entries moved within a slot,
keys turned to their new positions (backends/kv_splice.py says why one more turn suffices)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from localinfer.backends.base import MovedChunk
from localinfer.backends.kv_splice import (
    CellMove,
    cell_indices,
    move_tables,
    splice_in_place,
)
from localinfer.backends.rope_tables import inverse_frequencies
from localinfer.backends.torch.kv_cache import StaticKVCache

if TYPE_CHECKING:
    from localinfer.backends.torch.runner import TorchRunner


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


def splice_cache(runner: TorchRunner, slot: int, keep: int, chunks: Sequence[MovedChunk]) -> None:
    """``runner.splice``: the moved chunks wait beyond the slot's length while the new tokens
    before each are prefilled (kv_splice.splice_in_place)."""
    inv_freq = inverse_frequencies(runner.model_config)
    splice_in_place(
        runner.forward,
        lambda s, moves: move_cells(runner._cache, s, moves, inv_freq),
        runner._lengths,
        runner.config.max_ctx,
        slot,
        keep,
        chunks,
    )
