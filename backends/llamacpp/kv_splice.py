"""Cache reuse on the llama.cpp runner (``KVSplicer.splice``).

llama.cpp tags each cached cell with its position; ``llama_memory_seq_add`` changes the tags of a
range and turns those cells' keys by the same delta at the next decode, so a move costs no
recompute. What it cannot do is leave a gap to fill later: a decode must start right after the
sequence's last position, and any cell below a token's position is visible to it. So the new
tokens are prefilled after every moved chunk (seeing those chunks, the extra approximation of
this runner), then every piece is put in prompt order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localinfer.backends.base import MovedChunk, SlotWork
from localinfer.backends.kv_splice import Forward, check_splice
from localinfer.backends.slot_lengths import SlotLengths

Span = tuple[int, int]  # [start, end) of a slot's cells


def relayout(
    llama: Any, memory: Any, slot: int, length: int, keep: int, spans: Sequence[Span]
) -> int:
    """Cells ``[0, keep)`` of ``slot`` stay; ``spans`` (disjoint, within ``[keep, length)``)
    follow one after another in the order given; every other cell goes. Returns the new length.
    Keys are turned by llama.cpp at the next decode."""
    cursor = keep
    for start, end in sorted(spans):
        if cursor < start:
            _remove(llama, memory, slot, cursor, start)
        cursor = end
    if cursor < length:
        _remove(llama, memory, slot, cursor, -1)
    # Lift every kept cell above the old end first, so each span is picked out by its lifted
    # positions alone, never together with a cell already placed.
    lift = length - keep
    if lift:
        llama.llama_memory_seq_add(memory, slot, keep, length, lift)
    at = keep
    for start, end in spans:
        llama.llama_memory_seq_add(memory, slot, start + lift, end + lift, at - start - lift)
        at += end - start
    return at


def _remove(llama: Any, memory: Any, slot: int, start: int, end: int) -> None:
    if not llama.llama_memory_seq_rm(memory, slot, start, end):
        raise RuntimeError(f"llama.cpp refused to remove cells [{start}, {end}) of slot {slot}")


def splice_slot(
    llama: Any,
    memory: Any,
    lengths: SlotLengths,
    max_ctx: int,
    forward: Forward,
    slot: int,
    keep: int,
    chunks: Sequence[MovedChunk],
) -> None:
    """``kv_cache.splice``: pack the chunks after ``keep``, prefill all new tokens after them
    (``forward``: the runner's, which records what it wrote in ``lengths``), then put new tokens
    and chunks in prompt order."""
    length = lengths.checked(slot)
    check_splice(length, keep, chunks, max_ctx)
    if chunks and not llama.llama_memory_can_shift(memory):
        raise NotImplementedError("this model's llama.cpp cache cannot move cells")
    packed = relayout(llama, memory, slot, length, keep, [(c.start, c.end) for c in chunks])
    lengths[slot] = packed
    new = tuple(t for c in chunks for t in c.new)
    if not new:
        return  # chunks only: already in prompt order
    forward([SlotWork(slot, new, packed)])
    order: list[Span] = []
    chunk_at, new_at = keep, packed
    for chunk in chunks:
        if chunk.new:
            order.append((new_at, new_at + len(chunk.new)))
            new_at += len(chunk.new)
        order.append((chunk_at, chunk_at + chunk.end - chunk.start))
        chunk_at += chunk.end - chunk.start
    lengths[slot] = relayout(llama, memory, slot, new_at, keep, order)
