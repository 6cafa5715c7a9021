"""The constraint of one sequence: which tokens may come next, and the state after each one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from localinfer.constraints.bitmask import allocate_bitmask, bitmask_to_bool

if TYPE_CHECKING:
    import llguidance


class TokenRefusedError(RuntimeError):
    """A token the constraint did not allow was fed to it: a sampler bug, never user input."""


class TokenConstraint:
    """Per-sequence state over a compiled grammar.

    ``allowed()`` is a bitmask: int32 words, bit ``i % 32`` of word ``i // 32`` set when token
    ``i`` may come next (the layout llguidance, xgrammar and vLLM share). End-of-sequence ids are
    allowed exactly when the answer so far is complete; feeding one finishes the constraint.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """A fresh bitmask for the next token; [ceil(vocab / 32)] int32."""
        mask = allocate_bitmask(1, self.vocab_size)[0]
        self.fill_allowed(mask)
        return mask

    def fill_allowed(self, out: np.ndarray) -> None:
        """Write the next-token bitmask into ``out`` (a contiguous int32 row, e.g. one row of a
        batch's bitmask), without allocating."""
        if out.dtype != np.int32 or not out.flags["C_CONTIGUOUS"]:
            raise ValueError("the bitmask row must be contiguous int32")
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def allowed_bool(self) -> np.ndarray:
        """The next-token mask as [vocab] bool (slower than the bitmask; for tests and tools)."""
        return bitmask_to_bool(self.allowed(), self.vocab_size)

    def advance(self, token_id: int) -> None:
        """Take the sampled token. Raises TokenRefusedError if the constraint forbids it."""
        if not self._matcher.consume_token(token_id):
            raise TokenRefusedError(
                f"token {token_id} is not allowed here: {self._matcher.get_error()}"
            )

    def accepted_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (a speculative draft) the constraint would take in order,
        without taking them."""
        return self._matcher.validate_tokens(list(tokens))

    def is_finished(self) -> bool:
        """True once an end-of-sequence token was taken, or nothing more can follow."""
        return self._matcher.is_stopped()

    def is_complete(self) -> bool:
        """True when the text so far is a whole answer (it may still go on, as a number can)."""
        return self._matcher.is_accepting()

    def rollback(self, count: int) -> None:
        """Forget the last ``count`` tokens taken (speculation rejected them)."""
        if count and not self._matcher.rollback(count):
            raise ValueError(f"cannot roll back {count} tokens: {self._matcher.get_error()}")
