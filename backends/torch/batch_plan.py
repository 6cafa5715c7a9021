"""How one ragged batch of SlotWork is laid out for a single forward pass (no model math here).

All tokens of the batch are packed into one sequence ``[T]`` so every linear layer (where decode
spends its time reading weights) runs once. Attention differs per slot, so the packed tokens are
split into *attention groups*, each computed with one scaled-dot-product call against a view of the
static cache (no copies of K/V):

* all short items (decode steps, speculative verifies: ``<= SMALL_ITEM`` tokens) form one group
  over the span of slots ``[lo, hi)`` they touch, queries padded to the longest item;
* each long item (a prefill chunk) is its own group over its own slot, so a 512-token chunk never
  pads seven one-token decodes up to 512 rows.

Tokens are packed group by group (within the small group by slot), so each group's tokens are one
contiguous slice of the packed sequence. The runner maps logits back to batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localinfer.backends.base import SlotWork

# Items up to this many tokens share one padded attention call; longer ones get their own call.
SMALL_ITEM = 16


@dataclass(slots=True, frozen=True)
class GroupPlan:
    """One attention call: slots ``[lo, hi)``, queries padded to ``q_len`` per slot."""

    token_start: int  # this group's tokens are packed[token_start:token_end]
    token_end: int
    lo: int
    hi: int
    q_len: int  # padded query rows per slot
    kv_len: int  # keys 0..kv_len-1 of each slot in the span are read
    # Per packed token of the group: flat row in the padded [span * q_len] layout.
    flat_rows: tuple[int, ...]
    # Padded [span][q_len] absolute positions; -1 marks padding (a slot not in this group, or
    # rows past an item's length).
    positions: tuple[tuple[int, ...], ...]

    @property
    def span(self) -> int:
        return self.hi - self.lo

    @property
    def dense(self) -> bool:
        """True when the group's tokens fill the padded layout exactly, in order (no scatter)."""
        return len(self.flat_rows) == self.span * self.q_len


@dataclass(slots=True, frozen=True)
class BatchPlan:
    tokens: tuple[int, ...]  # [T] packed token ids
    slots: tuple[int, ...]  # [T] slot of each packed token
    positions: tuple[int, ...]  # [T] absolute position of each packed token
    groups: tuple[GroupPlan, ...]
    # Per batch item (batch order): the packed rows whose logits it wants.
    logit_rows: tuple[tuple[int, ...], ...]


def plan_batch(batch: Sequence[SlotWork]) -> BatchPlan:
    """Pack a validated batch (see base.check_batch) into one sequence plus attention groups."""
    order = sorted(range(len(batch)), key=lambda i: batch[i].slot)
    small = [i for i in order if len(batch[i].tokens) <= SMALL_ITEM]
    large = [i for i in order if len(batch[i].tokens) > SMALL_ITEM]

    tokens: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    first_row: dict[int, int] = {}  # batch index -> its first packed row
    groups: list[GroupPlan] = []

    for members in ([small] if small else []) + [[i] for i in large]:
        start = len(tokens)
        lo = batch[members[0]].slot
        hi = batch[members[-1]].slot + 1
        q_len = max(len(batch[i].tokens) for i in members)
        padded = [[-1] * q_len for _ in range(hi - lo)]
        flat_rows: list[int] = []
        kv_len = 0
        for i in members:
            work = batch[i]
            first_row[i] = len(tokens)
            row = work.slot - lo
            for offset, token in enumerate(work.tokens):
                pos = work.start_pos + offset
                tokens.append(token)
                slots.append(work.slot)
                positions.append(pos)
                padded[row][offset] = pos
                flat_rows.append(row * q_len + offset)
            kv_len = max(kv_len, work.start_pos + len(work.tokens))
        groups.append(
            GroupPlan(
                token_start=start,
                token_end=len(tokens),
                lo=lo,
                hi=hi,
                q_len=q_len,
                kv_len=kv_len,
                flat_rows=tuple(flat_rows),
                positions=tuple(tuple(r) for r in padded),
            )
        )

    logit_rows = []
    for i, work in enumerate(batch):
        n = len(work.tokens)
        first = first_row[i]
        rows = range(first, first + n) if work.logits == "all" else (first + n - 1,)
        logit_rows.append(tuple(rows))
    return BatchPlan(
        tokens=tuple(tokens),
        slots=tuple(slots),
        positions=tuple(positions),
        groups=tuple(groups),
        logit_rows=tuple(logit_rows),
    )
