"""What a proposer hands to verification."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class Proposal:
    """k proposed tokens for one slot, and the distribution each was drawn from.

    ``q`` is None for deterministic proposals (n-gram lookup, a greedy draft): each token is then
    a point mass, and rejection sampling accepts token x with probability p(x).
    """

    tokens: tuple[int, ...]
    q: np.ndarray | None = None  # [k, vocab] float64 rows summing to 1, or None

    def __post_init__(self) -> None:
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(self.tokens)} tokens")

    @property
    def k(self) -> int:
        return len(self.tokens)
