"""The framework-free half of an embedding pass: which tokens run next, which rows are pooled,
and the pooling itself (numpy). A backend supplies one method, ``_run``: the final hidden
states (normed as before the LM head) of the rows each piece asks for.

A pass feeds its sequences in pieces, as a prompt is prefilled in chunks: each ``feed`` runs at
most its token budget, every sequence at most once, in order. Only the rows pooling needs leave
the backend: every row for ``mean``, the last token's for ``last``, the first token's for ``cls``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import EMBED_PASS_MAX_INPUTS, Pooling
from localinfer.errors import ContextOverflowError


@dataclass(slots=True, frozen=True)
class Piece:
    """Tokens of one sequence to run now, at positions ``start..start+len(tokens)-1``."""

    seq: int  # index of the sequence in the pass (the scratch slot it runs in)
    start: int
    tokens: tuple[int, ...]
    pooled: tuple[int, int] | None  # rows [lo, hi) of this piece that pooling reads; None: none


def check_inputs(
    inputs: Sequence[Sequence[int]], max_ctx: int, vocab: int
) -> list[tuple[int, ...]]:
    """The inputs as tuples of ints; ValueError when a pass cannot take them."""
    if not inputs:
        raise ValueError("an embedding pass needs at least one input")
    if len(inputs) > EMBED_PASS_MAX_INPUTS:
        raise ValueError(f"{len(inputs)} inputs in one pass; at most {EMBED_PASS_MAX_INPUTS}")
    out = []
    for i, ids in enumerate(inputs):
        tokens = tuple(int(t) for t in ids)
        if not tokens:
            raise ValueError(f"input {i} has no tokens")
        if len(tokens) > max_ctx:
            raise ContextOverflowError(len(tokens), max_ctx, what=f"input {i}")
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise ValueError(f"input {i}: token id out of range [0, {vocab})")
        out.append(tokens)
    return out


def pooled_rows(pieces: Sequence[Piece], rows: Sequence[Sequence[int]]) -> list[int]:
    """The packed rows pooling reads, piece after piece; ``rows[k]``: piece k's packed rows in
    token order (ragged_batch's ``logit_rows`` of ``logits="all"`` work)."""
    wanted: list[int] = []
    for piece, piece_rows in zip(pieces, rows, strict=True):
        if piece.pooled is not None:
            wanted.extend(piece_rows[piece.pooled[0] : piece.pooled[1]])
    return wanted


def split_pooled(pieces: Sequence[Piece], out: np.ndarray) -> list[np.ndarray | None]:
    """``out`` ([R, hidden], the rows of :func:`pooled_rows`) cut back into one array per piece
    (None for a piece that pools nothing)."""
    result: list[np.ndarray | None] = []
    at = 0
    for piece in pieces:
        if piece.pooled is None:
            result.append(None)
            continue
        n = piece.pooled[1] - piece.pooled[0]
        result.append(out[at : at + n])
        at += n
    return result


class PooledPass:
    """An EmbeddingPass (backends/base.py) but for ``_run``, which subclasses implement."""

    def __init__(
        self,
        inputs: Sequence[Sequence[int]],
        pooling: Pooling,
        hidden: int,
        max_ctx: int,
        vocab: int,
    ) -> None:
        if pooling not in ("mean", "last", "cls"):
            raise ValueError(f"unknown pooling {pooling!r}")
        self.inputs = check_inputs(inputs, max_ctx, vocab)
        self.pooling = pooling
        self._fed = [0] * len(self.inputs)
        self._sums = np.zeros((len(self.inputs), hidden), dtype=np.float64)  # [n, hidden]
        self._closed = False

    @property
    def longest(self) -> int:
        return max(len(t) for t in self.inputs)

    @property
    def done(self) -> bool:
        return all(f == len(t) for f, t in zip(self._fed, self.inputs, strict=True))

    def feed(self, max_tokens: int) -> int:
        if self._closed:
            raise RuntimeError("this embedding pass is closed")
        pieces = self._plan(max(1, max_tokens))
        if not pieces:
            return 0
        rows = self._run(pieces)
        for piece, out in zip(pieces, rows, strict=True):
            if piece.pooled is not None:
                assert out is not None and out.shape[0] == piece.pooled[1] - piece.pooled[0]
                self._sums[piece.seq] += out.astype(np.float64).sum(axis=0)
            self._fed[piece.seq] += len(piece.tokens)
        return sum(len(p.tokens) for p in pieces)

    def vectors(self) -> np.ndarray:
        if not self.done:
            raise RuntimeError("the embedding pass has tokens left to run")
        pooled = self._sums
        if self.pooling == "mean":
            pooled = pooled / np.array([len(t) for t in self.inputs], dtype=np.float64)[:, None]
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)  # [n, hidden]

    def close(self) -> None:
        self._closed = True

    # -- internals -------------------------------------------------------------------------

    def _run(self, pieces: list[Piece]) -> list[np.ndarray | None]:
        """Per piece, float32 ``[hi - lo, hidden]`` normed final hidden states of its pooled
        rows (None where it has none). Subclasses run the model here."""
        raise NotImplementedError

    def _plan(self, budget: int) -> list[Piece]:
        pieces = []
        for i, tokens in enumerate(self.inputs):
            start = self._fed[i]
            if start == len(tokens) or budget == 0:
                continue
            n = min(len(tokens) - start, budget)
            budget -= n
            pieces.append(Piece(i, start, tokens[start : start + n], self._pooled(i, start, n)))
        return pieces

    def _pooled(self, seq: int, start: int, n: int) -> tuple[int, int] | None:
        if self.pooling == "mean":
            return (0, n)
        if self.pooling == "last":
            return (n - 1, n) if start + n == len(self.inputs[seq]) else None
        return (0, 1) if start == 0 else None
