"""What the engine needs from a constrained-decoding request: a source that starts one
constraint per sequence, and a per-sequence constraint that says which tokens may come next.

localinfer.constraints' CompiledConstraint / TokenConstraint fit these protocols; the engine
knows nothing of grammars. Masks are packed int32 bitmasks (bit ``i % 32`` of word ``i // 32``
set when token ``i`` is allowed), the layout llguidance, xgrammar and vLLM share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from localinfer.constraints.bitmask import allocate_bitmask, bitmask_to_bool


class SequenceConstraint(Protocol):
    """The constraint state of one sequence (localinfer.constraints.TokenConstraint fits)."""

    vocab_size: int

    def fill_allowed(self, out: np.ndarray) -> None:
        """Write the next-token bitmask into ``out`` ([ceil(vocab / 32)] contiguous int32)."""
        ...

    def advance(self, token_id: int) -> None:
        """Take the chosen token; raises if the constraint forbids it."""
        ...

    def is_finished(self) -> bool:
        """True once an end-of-sequence token was taken, or nothing more may follow."""
        ...

    def accepted_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` would be taken in order, without taking them."""
        ...

    def rollback(self, count: int) -> None:
        """Forget the last ``count`` tokens taken."""
        ...


class ConstraintSource(Protocol):
    """A compiled constraint a request carries; reusable: ``start()`` once per sequence
    (localinfer.constraints.CompiledConstraint fits)."""

    def start(self) -> SequenceConstraint: ...


class MaskedChoice:
    """Masks one sequence's logits with its constraint: its own bitmask row, allocated once."""

    def __init__(self, constraint: SequenceConstraint, vocab_size: int) -> None:
        if constraint.vocab_size < vocab_size:
            raise ValueError(
                f"the constraint covers {constraint.vocab_size} token ids, the engine samples "
                f"{vocab_size}: it was compiled for another vocabulary"
            )
        self.constraint = constraint
        self._row = allocate_bitmask(1, constraint.vocab_size)[0]  # [words] int32

    def mask(self, x: np.ndarray) -> np.ndarray:
        """A copy of ``x`` ([vocab] logits) with every token the constraint forbids at -inf."""
        self.constraint.fill_allowed(self._row)
        allowed = bitmask_to_bool(self._row, x.shape[0])  # [vocab] bool
        if not allowed.any():
            raise ValueError("the constraint allows no token the model can give")
        return np.where(allowed, x, np.float32(-np.inf))
