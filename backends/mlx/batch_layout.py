"""How one ragged batch of SlotWork is laid out for a single MLX forward (numpy only, no math).

Every token of the batch is packed into one sequence ``[T]`` so each matrix product (where decode
spends its time) runs once for the whole batch. Attention differs per slot, so packed tokens are
split into *attention groups*, one ``scaled_dot_product_attention`` call each:

* short items (decode steps, speculative verifies: ``<= SMALL_ITEM`` tokens) share one group,
  their queries padded to the longest of them;
* each long item (a prefill chunk) is a group of its own, so a 512-token chunk never pads the
  one-token decodes beside it to 512 rows.

A group holds only its member slots (not the idle slots between them): queries are gathered from
the packed rows into ``[members, heads, q_len, head_dim]`` and keys are the members' cache rows.
Tokens are packed group by group, so each group's tokens are one contiguous packed slice and the
concatenated group outputs are already in packed order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import SlotWork

# Items up to this many tokens share one padded attention call; longer ones get their own call.
SMALL_ITEM = 16


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
    order = sorted(range(len(batch)), key=lambda i: batch[i].slot)
    small = [i for i in order if len(batch[i].tokens) <= SMALL_ITEM]
    large = [i for i in order if len(batch[i].tokens) > SMALL_ITEM]

    tokens: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    first_row: dict[int, int] = {}  # batch index -> its first packed row
    groups: list[AttentionGroup] = []
    for members in ([small] if small else []) + [[i] for i in large]:
        start = len(tokens)
        for i in members:
            work = batch[i]
            first_row[i] = len(tokens)
            tokens.extend(work.tokens)
            slots.extend([work.slot] * len(work.tokens))
            positions.extend(range(work.start_pos, work.start_pos + len(work.tokens)))
        groups.append(_group([batch[i] for i in members], start, len(tokens), sliding_window))

    logit_rows = []
    for i, work in enumerate(batch):
        n, first = len(work.tokens), first_row[i]
        rows = range(first, first + n) if work.logits == "all" else (first + n - 1,)
        logit_rows.append(tuple(rows))
    return BatchLayout(
        tokens=np.asarray(tokens, dtype=np.int32),
        slots=np.asarray(slots, dtype=np.int32),
        positions=np.asarray(positions, dtype=np.int32),
        groups=tuple(groups),
        logit_rows=tuple(logit_rows),
    )


def _group(
    members: list[SlotWork], start: int, end: int, sliding_window: int | None
) -> AttentionGroup:
    q_len = max(len(w.tokens) for w in members)
    kv_len = max(w.start_pos + len(w.tokens) for w in members)
    pos = np.full((len(members), q_len), -1, dtype=np.int64)  # -1: padding row
    gather = np.empty((len(members), q_len), dtype=np.int32)
    scatter = np.empty(end - start, dtype=np.int32)
    row = start
    for m, work in enumerate(members):
        n = len(work.tokens)
        pos[m, :n] = np.arange(work.start_pos, work.start_pos + n)
        gather[m, :n] = np.arange(row, row + n)
        gather[m, n:] = row + n - 1
        scatter[row - start : row - start + n] = m * q_len + np.arange(n)
        row += n
    keys = np.arange(kv_len)
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
        token_end=end,
        slots=tuple(w.slot for w in members),
        q_len=q_len,
        kv_len=kv_len,
        gather_rows=gather.reshape(-1),
        scatter_rows=scatter,
        mask=None if mask.all() else mask,
        sliding_mask=sliding_mask,
    )
