"""A ragged batch as llama.cpp takes it: one row per token in batch order, in a llama_batch whose
arrays this process owns."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import SlotWork


class BatchBuffer:
    """A llama_batch whose arrays are numpy buffers we own, so filling it is a few slice copies.

    llama_batch_init would malloc one seq_id array per token and need a per-token ctypes write;
    here ``seq_id[i]`` points at row i of a ``[n_batch, 1]`` int32 array once, at construction.
    """

    def __init__(self, llama_cpp: object, n_batch: int) -> None:
        self.capacity = n_batch
        self.token = np.zeros(n_batch, dtype=np.int32)  # [n_batch]
        self.pos = np.zeros(n_batch, dtype=np.int32)  # [n_batch]
        self.n_seq_id = np.ones(n_batch, dtype=np.int32)  # [n_batch], one sequence per token
        self.seq = np.zeros((n_batch, 1), dtype=np.int32)  # [n_batch, 1]
        self.logits = np.zeros(n_batch, dtype=np.int8)  # [n_batch], 1 = output this row
        seq_ptr_t = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (seq_ptr_t * n_batch)(
            *[
                ctypes.cast(self.seq.ctypes.data + i * self.seq.strides[0], seq_ptr_t)
                for i in range(n_batch)
            ]
        )
        batch = llama_cpp.llama_batch()  # type: ignore[attr-defined]
        batch.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.embd = None
        batch.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = self._seq_ptrs
        batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        batch.n_tokens = 0
        self.batch = batch

    def fill(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, want: np.ndarray) -> int:
        """The batch set to these rows (``want`` flags the rows to output); returns their count."""
        n = len(tokens)
        self.token[:n] = tokens
        self.pos[:n] = pos
        self.seq[:n, 0] = seq
        self.logits[:n] = want
        self.batch.n_tokens = n
        return n


@dataclass(slots=True)
class OutputRows:
    """Where one SlotWork's logits rows land: rows [row, row + n) of the flat token list."""

    item: int
    row: int
    n: int


@dataclass(slots=True, frozen=True)
class FlatBatch:
    """The batch's tokens one row each, in batch order; ``want`` flags the rows to output."""

    tokens: np.ndarray  # [total] int32
    pos: np.ndarray  # [total] int32
    seq: np.ndarray  # [total] int32, the slot (llama.cpp sequence) of each row
    want: np.ndarray  # [total] int8
    outputs: list[OutputRows]  # per batch item, in batch order

    @property
    def total(self) -> int:
        return len(self.tokens)

    def slot_ends(self, start: int, end: int) -> list[tuple[int, int]]:
        """(slot, last position) of each slot with rows in ``[start, end)``: a slot's rows are
        consecutive and ascending, so the last one a dict keeps is its end."""
        seq, pos = self.seq[start:end].tolist(), self.pos[start:end].tolist()
        return list(dict(zip(seq, pos, strict=True)).items())


def decode_spans(want: np.ndarray, n_batch: int, max_outputs: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of a flat batch, in order, one ``llama_decode`` each: at most
    ``n_batch`` rows, of which at most ``max_outputs`` are flagged in ``want`` (llama.cpp aborts
    on a call with more outputs than its context reserved, context_shape.py)."""
    if 0 < len(want) <= min(n_batch, max_outputs):  # one call, whatever is flagged
        return [(0, len(want))]
    outputs = np.cumsum(want, dtype=np.int64)  # [total], outputs flagged in rows 0..i
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(want):
        before = int(outputs[start - 1]) if start else 0
        # The first row past which more than max_outputs would be flagged (> start: one row
        # flags at most one output).
        limit = int(np.searchsorted(outputs, before + max_outputs, side="right"))
        end = min(start + n_batch, len(want), limit)
        spans.append((start, end))
        start = end
    return spans


def flatten_batch(batch: Sequence[SlotWork], vocab: int) -> FlatBatch:
    """The rows of ``batch``, item by item in slot order (``outputs`` name the items by their
    index in ``batch``); ValueError for a token id outside ``[0, vocab)``. llama.cpp reuses the
    previous step's graph only when the batch lists the same sequences in the same order; the
    engine lists them in admission order, which changes whenever a request ends, and a rebuilt
    graph costs a sixth of an 8-sequence decode step."""
    for work in batch:  # min and max in C: a decode step's Python is on its critical path
        if work.tokens and (min(work.tokens) < 0 or max(work.tokens) >= vocab):
            bad = next(t for t in work.tokens if not 0 <= t < vocab)
            raise ValueError(f"slot {work.slot}: token id {bad} outside vocab {vocab}")
    if all(len(w.tokens) == 1 for w in batch):  # "last" and "all" are the one row
        return _flatten_steps(batch)
    total = sum(len(w.tokens) for w in batch)
    tokens = np.empty(total, dtype=np.int32)
    pos = np.empty(total, dtype=np.int32)
    seq = np.empty(total, dtype=np.int32)
    want = np.zeros(total, dtype=np.int8)
    outputs: list[OutputRows] = []
    row = 0
    for i in sorted(range(len(batch)), key=lambda k: batch[k].slot):
        work = batch[i]
        n = len(work.tokens)
        tokens[row : row + n] = work.tokens
        pos[row : row + n] = np.arange(work.start_pos, work.start_pos + n)
        seq[row : row + n] = work.slot
        if work.logits == "all":
            want[row : row + n] = 1
            outputs.append(OutputRows(i, row, n))
        else:
            want[row + n - 1] = 1
            outputs.append(OutputRows(i, row + n - 1, 1))
        row += n
    return FlatBatch(tokens, pos, seq, want, outputs)


def _flatten_steps(batch: Sequence[SlotWork]) -> FlatBatch:
    """flatten_batch of one token per item, each an output row: a decode step, in a few list
    operations rather than a numpy write per item."""
    order = sorted(range(len(batch)), key=lambda k: batch[k].slot)
    items = [batch[i] for i in order]
    return FlatBatch(
        tokens=np.array([w.tokens[0] for w in items], dtype=np.int32),
        pos=np.array([w.start_pos for w in items], dtype=np.int32),
        seq=np.array([w.slot for w in items], dtype=np.int32),
        want=np.ones(len(items), dtype=np.int8),
        outputs=[OutputRows(i, row, 1) for row, i in enumerate(order)],
    )
