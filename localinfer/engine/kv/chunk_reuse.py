"""Cache reuse beyond the shared prefix (``--cache-reuse N``, as llama.cpp's server has it).

Prefix reuse keeps only the longest common prefix of a slot's cached tokens and a new prompt.
When text is inserted into the middle of a prompt (a line typed into a file sent for
fill-in-the-middle), everything after it shifts and would be prefilled again. With cache reuse,
chunks of at least N cached tokens that reappear later in the prompt keep their KV: the runner's
KV cache moves their cells to the new positions (``KVSplicer.splice``), and only the tokens
between chunks are prefilled.

It is an approximation, so it is opt-in: a moved chunk's keys and values were computed without
the new text before it. With N = 0 (the default) nothing here runs and reuse stays exact.

Matching is greedy and in order, like llama.cpp's: from the end of the shared prefix, the prompt
is scanned for the first N-token window that also starts somewhere in the cache after the last
chunk taken; that match grows as far as both agree, becomes a chunk, and the scan goes on after
it. The last prompt token is never in a chunk (its logits give the first new token), and the new
tokens between chunks, prefilled while the request is admitted, stay within a budget.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from localinfer.backends.base import MovedChunk, Runner, kv_splicer
from localinfer.engine.slots import Slot, cut_slot

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ReusePlan:
    """How a slot's cache becomes a prompt's beginning: ``keep`` tokens stay in place, then each
    chunk's new tokens are prefilled and its cached cells moved after them. The slot then holds
    ``prompt[:end]``."""

    keep: int
    chunks: tuple[MovedChunk, ...]
    end: int

    @property
    def reused(self) -> int:
        """Prompt tokens whose KV comes from the cache (the kept prefix and the chunks)."""
        return self.keep + sum(c.end - c.start for c in self.chunks)

    @property
    def new_tokens(self) -> int:
        """Tokens prefilled between chunks while the request is admitted."""
        return sum(len(c.new) for c in self.chunks)


def plan_reuse(
    cached: Sequence[int],
    prompt: Sequence[int],
    keep: int,
    min_chunk: int,
    max_new: int,
) -> ReusePlan:
    """The chunks of ``cached`` after ``keep`` (the shared prefix) that ``prompt`` reuses: each
    at least ``min_chunk`` tokens, in order in both, ending before the prompt's last token, with
    at most ``max_new`` new tokens before them in all."""
    limit = len(prompt) - 1  # the last prompt token is always fed
    chunks: list[MovedChunk] = []
    if min_chunk < 1 or keep + min_chunk > min(limit, len(cached)):
        return ReusePlan(keep, (), keep)
    index = _WindowIndex(cached, keep, min_chunk)
    prompt_hashes = _window_hashes(prompt[:limit], min_chunk)
    pos, floor, gap_start, fed = keep, keep, keep, 0
    while pos + min_chunk <= limit and fed + pos - gap_start <= max_new:
        src = index.find(int(prompt_hashes[pos]), floor, prompt, pos)
        if src is None:
            pos += 1
            continue
        n = min_chunk
        while pos + n < limit and src + n < len(cached) and cached[src + n] == prompt[pos + n]:
            n += 1
        chunks.append(MovedChunk(tuple(prompt[gap_start:pos]), src, src + n))
        fed += pos - gap_start
        pos += n
        floor, gap_start = src + n, pos
    return ReusePlan(keep, tuple(chunks), gap_start)


def prepare_slot(
    runner: Runner,
    slot: Slot,
    prompt: Sequence[int],
    keep: int,
    min_chunk: int,
    max_new: int,
) -> int:
    """Make ``slot`` hold the start of ``prompt`` for a new request; returns how many prompt
    tokens it reuses from the cache.

    ``keep`` tokens of shared prefix stay. With ``min_chunk`` > 0 and a runner whose KV cache
    can move cells (KVSplicer), reusable chunks after it are spliced in (``plan_reuse``);
    otherwise, or when the splice fails, the slot is cut to the prefix (``cut_slot``)."""
    splicer = kv_splicer(runner) if min_chunk > 0 else None
    if splicer is not None:
        plan = plan_reuse(slot.cached, prompt, keep, min_chunk, max_new)
        if plan.chunks:
            try:
                splicer.splice(slot.index, keep, plan.chunks)
                if runner.slot_length(slot.index) != plan.end:
                    raise RuntimeError(f"slot holds {runner.slot_length(slot.index)} cells")
            except NotImplementedError as exc:  # this model's cache cannot move cells
                log.debug("slot %d: no cache reuse: %s", slot.index, exc)
                return cut_slot(runner, slot, keep)
            except Exception:  # noqa: BLE001 - cells [0, keep) survive: plain prefix reuse
                log.exception("splicing slot %d failed; reusing its prefix only", slot.index)
                return cut_slot(runner, slot, keep)
            slot.cached[:] = prompt[: plan.end]
            return plan.reused
    return cut_slot(runner, slot, keep)


class _WindowIndex:
    """Where each ``n``-token window of ``cached`` at or after ``start`` begins, by its hash."""

    def __init__(self, cached: Sequence[int], start: int, n: int) -> None:
        self.cached = cached
        self.n = n
        self.starts: dict[int, list[int]] = {}
        for i, h in enumerate(_window_hashes(cached[start:], n).tolist(), start):
            self.starts.setdefault(h, []).append(i)  # ascending

    def find(self, h: int, floor: int, prompt: Sequence[int], pos: int) -> int | None:
        """The first window at or after ``floor`` holding ``prompt[pos:pos + n]``."""
        starts = self.starts.get(h)
        if not starts:
            return None
        want = list(prompt[pos : pos + self.n])
        for src in starts[bisect.bisect_left(starts, floor) :]:
            if list(self.cached[src : src + self.n]) == want:  # hashes can collide
                return src
        return None


def _window_hashes(tokens: Sequence[int], n: int) -> np.ndarray:
    """[len(tokens) - n + 1] uint64: a hash of every ``n``-token window (a dot product with
    fixed odd multipliers, wrapping mod 2**64); empty when fewer than ``n`` tokens."""
    if len(tokens) < n:
        return np.empty(0, dtype=np.uint64)
    mult = np.random.default_rng(n).integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + 1
    windows = sliding_window_view(np.asarray(tokens, dtype=np.uint64), n)  # [W, n]
    return windows @ mult
