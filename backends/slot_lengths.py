"""Tokens cached per slot, with the checks every runner makes before touching a slot."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class SlotLengths(list[int]):
    """``lengths[slot]`` = tokens cached in that slot (a plain list for ``check_batch``)."""

    def __init__(self, slots: int) -> None:
        super().__init__([0] * slots)

    def checked(self, slot: int) -> int:
        """The slot's length; ValueError for a slot the runner does not have."""
        if not 0 <= slot < len(self):
            raise ValueError(f"slot {slot} out of range (runner has {len(self)} slots)")
        return self[slot]

    def check_truncate(self, slot: int, length: int) -> None:
        """ValueError unless ``length`` is between 0 and what the slot holds."""
        held = self.checked(slot)
        if not 0 <= length <= held:
            raise ValueError(f"slot {slot}: cannot truncate to {length}, it holds {held} tokens")


def split_logits(out: np.ndarray, logit_rows: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Cut ``out`` ([R, vocab], the wanted rows in batch order) into one array per batch item."""
    results, start = [], 0
    for rows in logit_rows:
        results.append(out[start : start + len(rows)])
        start += len(rows)
    return results
