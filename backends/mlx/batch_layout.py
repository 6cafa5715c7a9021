"""An MLX attention group's index and mask arrays (numpy; the runner moves them to MLX).

The batch is packed by backends/ragged_batch.py. A group here holds only its member slots (not
the idle slots between them): queries are gathered from the packed rows into
``[members, heads, q_len, head_dim]`` and keys are the members' cache rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import SlotWork
from localinfer.backends.ragged_batch import SMALL_ITEM, PackedGroup, pack_batch

__all__ = ["SMALL_ITEM", "AttentionGroup", "BatchLayout", "layout_batch"]


@dataclass(slots=True, frozen=True)
class AttentionGroup:
    token_start: int  # this group's tokens are packed[token_start:token_end]
    token_end: int
    slots: tuple[int, ...]  # member slots, ascending
    q_len: int  # padded query rows per member
    kv_len: int  # keys 0..kv_len-1 of each member slot are read
    # Padded row (member * q_len + offset) -> packed row to read the query from; padding rows
    # repeat a real row and are masked and dropped.
    gather_rows: np.ndarray  # [members * q_len] int32
    # Packed row of the group (relative to token_start) -> its padded row.
    scatter_rows: np.ndarray  # [token_end - token_start] int32
    mask: np.ndarray | None  # [members, 1, q_len, kv_len] bool; None: every query sees every key
    # The same with the sliding window applied (None: every query sees every key, or no window).
    sliding_mask: np.ndarray | None

    @property
    def dense(self) -> bool:
        """True when padded rows are exactly the packed rows, in order (no gather needed)."""
        return len(self.scatter_rows) == len(self.gather_rows)

    @property
    def contiguous(self) -> bool:
        """True when member slots are consecutive, so their cache rows are one slice."""
        return self.slots[-1] - self.slots[0] + 1 == len(self.slots)


@dataclass(slots=True, frozen=True)
class BatchLayout:
    tokens: np.ndarray  # [T] int32 packed token ids
    slots: np.ndarray  # [T] int32 slot of each packed token
    positions: np.ndarray  # [T] int32 absolute position of each packed token
    groups: tuple[AttentionGroup, ...]
    # Per batch item (batch order): the packed rows whose logits it wants.
    logit_rows: tuple[tuple[int, ...], ...]


def layout_batch(batch: Sequence[SlotWork], sliding_window: int | None = None) -> BatchLayout:
    """Pack a validated batch (see base.check_batch)."""
    packed = pack_batch(batch)
    return BatchLayout(
        tokens=np.asarray(packed.tokens, dtype=np.int32),
        slots=np.asarray(packed.slots, dtype=np.int32),
        positions=np.asarray(packed.positions, dtype=np.int32),
        groups=tuple(_group(g, sliding_window) for g in packed.groups),
        logit_rows=packed.logit_rows,
    )


def _group(g: PackedGroup, sliding_window: int | None) -> AttentionGroup:
    members, q_len, start = len(g.members), g.q_len, g.token_start
    rows = range(members)
    pos = g.padded_positions(rows, members)  # [members, q_len]; -1: padding row
    gather = np.empty((members, q_len), dtype=np.int32)
    row = start
    for m, work in enumerate(g.members):
        n = len(work.tokens)
        gather[m, :n] = np.arange(row, row + n)
        gather[m, n:] = row + n - 1
        row += n
    keys = np.arange(g.kv_len)
    causal = keys <= pos[..., None]  # [members, q_len, kv_len]; padding rows see nothing
    # Padding rows still see key 0: softmax over no keys is NaN on some devices. Dropped anyway.
    padding = (pos < 0)[..., None] & (keys == 0)
    mask = (causal | padding)[:, None]  # [members, 1, q_len, kv_len]
    sliding_mask = None
    if sliding_window is not None:
        in_window = (pos[..., None] - keys) < sliding_window
        sliding_mask = ((causal & in_window) | padding)[:, None]
        if sliding_mask.all():
            sliding_mask = None
    return AttentionGroup(
        token_start=start,
        token_end=g.token_end,
        slots=g.slots,
        q_len=q_len,
        kv_len=g.kv_len,
        gather_rows=gather.reshape(-1),
        scatter_rows=g.padded_rows(rows).astype(np.int32),
        mask=None if mask.all() else mask,
        sliding_mask=sliding_mask,
    )
