"""What every runner's cache splice (``KVSplicer.splice``, ``--cache-reuse``) shares: the checks,
where each moved chunk lands, the rotation that re-positions a stored key, the runner's forward
as its KV cache holds it (``weak_forward``), and the whole splice for caches written at absolute
positions (torch, MLX).

Keys are cached after RoPE. RoPE turns each pair of a head's dimensions by ``pos x freq``, and
turns compose by adding their angles, so a key stored at ``p`` becomes the key RoPE would give at
``p + delta`` when turned once more by ``delta x freq``: no pre-RoPE key needs keeping.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import MovedChunk, SlotWork
from localinfer.backends.slot_lengths import SlotLengths


@dataclass(slots=True, frozen=True)
class CellMove:
    """Cells ``[src, end)`` of a slot go to ``[dst, dst + end - src)``."""

    src: int
    end: int
    dst: int

    @property
    def n(self) -> int:
        return self.end - self.src

    @property
    def delta(self) -> int:
        return self.dst - self.src


def check_splice(length: int, keep: int, chunks: Sequence[MovedChunk], max_ctx: int) -> int:
    """ValueError unless ``chunks`` fit a slot holding ``length`` cells (ascending, disjoint,
    within ``[keep, length)``, the result within ``max_ctx``); returns the spliced length."""
    if not 0 <= keep <= length:
        raise ValueError(f"splice: keep {keep} outside the slot's {length} cells")
    floor, total = keep, keep
    for chunk in chunks:
        if chunk.start < floor or chunk.end > length:
            raise ValueError(
                f"splice: chunk [{chunk.start}, {chunk.end}) is not ascending within "
                f"[{keep}, {length})"
            )
        floor = chunk.end
        total += len(chunk.new) + chunk.end - chunk.start
    if total > max_ctx:
        raise ValueError(f"splice: {total} cells exceed the context of {max_ctx}")
    return total


def chunk_moves(keep: int, chunks: Sequence[MovedChunk]) -> list[CellMove]:
    """Where each chunk's cells land: after ``keep``, each chunk's new tokens and the chunks
    before it."""
    moves, at = [], keep
    for chunk in chunks:
        at += len(chunk.new)
        moves.append(CellMove(chunk.start, chunk.end, at))
        at += chunk.end - chunk.start
    return moves


def move_angles(moves: Sequence[CellMove], inv_freq: np.ndarray) -> np.ndarray:
    """[cells, head_dim / 2] float64: the angle each moved cell's key turns by (delta x freq),
    cells in move order."""
    deltas = np.concatenate([np.full(m.n, m.delta, dtype=np.float64) for m in moves])
    return np.outer(deltas, inv_freq)


def move_tables(moves: Sequence[CellMove], inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed-sin rows [cells, head_dim] for the rotate-half form (rope_tables.py):
    ``key * cos + cat(k2, k1) * signed_sin`` turns each moved key by its cell's delta."""
    angles = move_angles(moves, inv_freq)
    cos = np.concatenate([np.cos(angles), np.cos(angles)], axis=-1)
    signed_sin = np.concatenate([-np.sin(angles), np.sin(angles)], axis=-1)
    return cos, signed_sin


def cell_indices(moves: Sequence[CellMove]) -> tuple[np.ndarray, np.ndarray]:
    """Source and destination positions [cells] int64, in move order."""
    src = np.concatenate([np.arange(m.src, m.end) for m in moves])
    dst = np.concatenate([np.arange(m.dst, m.dst + m.n) for m in moves])
    return src, dst


MoveCells = Callable[[int, Sequence[CellMove]], None]  # (slot, moves): every read before a write
Forward = Callable[[Sequence[SlotWork]], list[np.ndarray]]


def weak_forward(forward: Forward) -> Forward:
    """A runner's bound ``forward`` that does not keep the runner alive (the runner holds its
    cache: a strong reference back would leave both, weights included, to the cycle collector)."""
    ref = weakref.WeakMethod(forward)  # type: ignore[arg-type]

    def call(batch: Sequence[SlotWork]) -> list[np.ndarray]:
        method = ref()
        if method is None:
            raise RuntimeError("runner is closed")
        return method(batch)

    return call


def splice_in_place(
    forward: Forward,
    move_cells: MoveCells,
    lengths: SlotLengths,
    max_ctx: int,
    slot: int,
    keep: int,
    chunks: Sequence[MovedChunk],
) -> None:
    """The splice of a runner whose cache is written at absolute positions and read only up to
    each query's position (torch, MLX): the moved chunks wait at their final positions, beyond
    the slot's length, while the new tokens before each are prefilled, so each new token sees
    only what precedes it. ``move_cells`` copies every move's keys (turned by its delta) and
    values, all reads before any write; ``lengths`` is the runner's bookkeeping."""
    check_splice(lengths.checked(slot), keep, chunks, max_ctx)
    moves = chunk_moves(keep, chunks)
    if moves:
        # The moves land beyond the new tokens' positions, so the prefills below overwrite only
        # cells already moved (or dropped), and their queries never read a moved cell.
        move_cells(slot, moves)
    lengths[slot] = keep
    for chunk, move in zip(chunks, moves, strict=True):
        if chunk.new:
            forward([SlotWork(slot, chunk.new, lengths[slot])])
        lengths[slot] = move.dst + move.n
