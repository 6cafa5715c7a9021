"""How one ragged batch of SlotWork is packed for a single forward pass (no framework, no math).

Every token of the batch is packed into one sequence ``[T]`` so each matrix product (where decode
spends its time reading weights) runs once for the whole batch. Attention differs per slot, so the
packed tokens are split into *attention groups*, one attention call each:

* all short items (decode steps, speculative verifies: ``<= SMALL_ITEM`` tokens) form one group,
  their queries padded to the longest of them;
* each long item (a prefill chunk) is a group of its own, so a 512-token chunk never pads seven
  one-token decodes up to 512 rows.

Tokens are packed group by group (within the small group by slot), so each group's tokens are one
contiguous slice of the packed sequence and the groups' outputs concatenate in packed order. How a
group's queries are padded and masked is the runner's (torch/attention.py, mlx/batch_layout.py);
the helpers here lay members out at the rows it chooses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import SlotWork

# Items up to this many tokens share one padded attention call; longer ones get their own call.
SMALL_ITEM = 16


@dataclass(slots=True, frozen=True)
class PackedGroup:
    """The items of one attention call, in ascending slot order."""

    token_start: int  # this group's tokens are packed[token_start:token_end]
    token_end: int
    members: tuple[SlotWork, ...]
    q_len: int  # the longest member: query rows per member once padded
    kv_len: int  # keys 0..kv_len-1 of each member's slot are read

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(w.slot for w in self.members)

    def padded_rows(self, rows: Sequence[int]) -> np.ndarray:
        """Per packed token of the group: its row in a padded ``[rows, q_len]`` layout where
        member m sits at row ``rows[m]``. -> [token_end - token_start] int64."""
        q_len = self.q_len
        return np.concatenate(
            [r * q_len + np.arange(len(w.tokens)) for r, w in zip(rows, self.members, strict=True)]
        )

    def padded_positions(self, rows: Sequence[int], n_rows: int) -> np.ndarray:
        """Absolute positions in that padded layout: [n_rows, q_len] int64, -1 where no token
        is (rows of no member, rows past a member's length)."""
        pos = np.full((n_rows, self.q_len), -1, dtype=np.int64)
        for r, w in zip(rows, self.members, strict=True):
            pos[r, : len(w.tokens)] = np.arange(w.start_pos, w.start_pos + len(w.tokens))
        return pos


@dataclass(slots=True, frozen=True)
class PackedBatch:
    tokens: tuple[int, ...]  # [T] packed token ids
    slots: tuple[int, ...]  # [T] slot of each packed token
    positions: tuple[int, ...]  # [T] absolute position of each packed token
    groups: tuple[PackedGroup, ...]
    # Per batch item (batch order): the packed rows whose logits it wants.
    logit_rows: tuple[tuple[int, ...], ...]

    def wanted_rows(self) -> list[int]:
        """Every packed row whose logits are wanted, in batch order."""
        return [r for rows in self.logit_rows for r in rows]


def pack_batch(batch: Sequence[SlotWork]) -> PackedBatch:
    """Pack a validated batch (see base.check_batch) into one sequence plus attention groups."""
    order = sorted(range(len(batch)), key=lambda i: batch[i].slot)
    small = [i for i in order if len(batch[i].tokens) <= SMALL_ITEM]
    large = [i for i in order if len(batch[i].tokens) > SMALL_ITEM]

    tokens: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    first_row: dict[int, int] = {}  # batch index -> its first packed row
    groups: list[PackedGroup] = []
    for members in ([small] if small else []) + [[i] for i in large]:
        start = len(tokens)
        for i in members:
            work = batch[i]
            first_row[i] = len(tokens)
            tokens.extend(work.tokens)
            slots.extend([work.slot] * len(work.tokens))
            positions.extend(range(work.start_pos, work.start_pos + len(work.tokens)))
        items = tuple(batch[i] for i in members)
        groups.append(
            PackedGroup(
                token_start=start,
                token_end=len(tokens),
                members=items,
                q_len=max(len(w.tokens) for w in items),
                kv_len=max(w.start_pos + len(w.tokens) for w in items),
            )
        )

    logit_rows = []
    for i, work in enumerate(batch):
        n, first = len(work.tokens), first_row[i]
        rows = range(first, first + n) if work.logits == "all" else (first + n - 1,)
        logit_rows.append(tuple(rows))
    return PackedBatch(
        tokens=tuple(tokens),
        slots=tuple(slots),
        positions=tuple(positions),
        groups=tuple(groups),
        logit_rows=tuple(logit_rows),
    )
