"""Tokens cached per slot, with the checks every runner makes before touching a slot."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localinfer.backends.base import Pooling, RunnerConfig, SlotWork, check_batch, embed_all


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


class InPlaceSlots:
    """The Runner protocol's bookkeeping for a runner whose KV cache is preallocated per slot and
    written at absolute positions (torch, MLX): rollback is a length change, and the next write
    overwrites what lies past it. Subclasses set ``_lengths``, ``config``, ``kv_cache`` and
    ``_closed``, hold the model and the cache as ``_model`` and ``_cache``, and start embedding
    passes (``start_embedding``)."""

    _lengths: SlotLengths
    _closed: bool
    config: RunnerConfig

    def embed(self, inputs: Sequence[Sequence[int]], pooling: Pooling) -> np.ndarray:
        return embed_all(self, inputs, pooling, self.config.max_ctx)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.kv_cache.close()  # type: ignore[attr-defined]
        del self._model, self._cache  # type: ignore[attr-defined]
        self._free_device_memory()

    def _free_device_memory(self) -> None:
        """Hand what the closed runner held back to the device (a subclass's allocator)."""

    def slot_length(self, slot: int) -> int:
        return self._lengths.checked(slot)

    def truncate(self, slot: int, length: int) -> None:
        self._lengths.check_truncate(slot, length)
        self._lengths[slot] = length

    def release(self, slot: int) -> None:
        self.truncate(slot, 0)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("runner is closed")

    def _check_forward(self, batch: Sequence[SlotWork], max_ctx: int, vocab: int) -> None:
        """check_batch, and every token id a row of the embedding table: checked here because
        an out-of-range id is a device-side assert on CUDA (the whole context dies) and a
        silent read of another row in an MLX gather."""
        self._check_open()
        check_batch(batch, self._lengths, max_ctx)
        for work in batch:
            if min(work.tokens) < 0 or max(work.tokens) >= vocab:
                raise ValueError(f"slot {work.slot}: token id out of range [0, {vocab})")

    def _advance(self, batch: Sequence[SlotWork]) -> None:
        """Record what a finished forward wrote."""
        for work in batch:
            self._lengths[work.slot] = work.start_pos + len(work.tokens)
