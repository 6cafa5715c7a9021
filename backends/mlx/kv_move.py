"""Cache reuse on the MLX runner (``KVSplicer.splice``): cached entries moved within a slot, keys
turned to their new positions (backends/kv_splice.py says why one more turn suffices)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from localinfer.backends.base import MovedChunk
from localinfer.backends.kv_splice import CellMove, cell_indices, move_tables, splice_in_place
from localinfer.backends.mlx.kv_cache import SlotKVCache
from localinfer.backends.rope_tables import inverse_frequencies

if TYPE_CHECKING:
    from localinfer.backends.mlx.runner import MLXRunner


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


def splice_cache(runner: MLXRunner, slot: int, keep: int, chunks: Sequence[MovedChunk]) -> None:
    """``runner.splice``: the moved chunks wait beyond the slot's length while the new tokens
    before each are prefilled (kv_splice.splice_in_place)."""
    inv_freq = inverse_frequencies(runner.model_config)

    def move(s: int, moves: Sequence[CellMove]) -> None:
        with mx.stream(runner.device):
            move_cells(runner._cache, s, moves, inv_freq)

    splice_in_place(
        runner.forward, move, runner._lengths, runner.config.max_ctx, slot, keep, chunks
    )
