"""Token bitmasks as numpy arrays: one bit per vocabulary id, packed into int32 words, bit
``i % 32`` of word ``i // 32``. Runners apply them to their own logits."""

from __future__ import annotations

import numpy as np


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> np.ndarray:
    """[rows, ceil(vocab / 32)] int32, every token allowed (a row left alone constrains nothing)."""
    return np.full((rows, bitmask_words(vocab_size)), -1, dtype=np.int32)


def bitmask_to_bool(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """[..., words] int32 -> [..., vocab] bool (a view of a fresh array of 0/1 bytes)."""
    bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].view(np.bool_)


def apply_bitmask(logits: np.ndarray, mask: np.ndarray) -> None:
    """Set the logits of forbidden tokens to -inf in place; [..., vocab] with [..., words]."""
    allowed = bitmask_to_bool(mask, logits.shape[-1])
    logits[~allowed] = -np.inf
