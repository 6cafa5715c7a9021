"""The ``KVCache`` (backends/base.py) of a runner whose cache is one ``[slots, kv_heads, max_ctx,
head_dim]`` pair of tensors per layer, written at absolute positions (torch, MLX): the checks,
the bookkeeping, the layout key and the splice, framework-free. Each framework's subclass supplies
the tensor operations (``_copy_rows``, ``_read_rows``, ``_write_rows``, ``_move_cells``) and the
final norm's bytes.

Payload: ``[layers, k|v, kv_heads, n, head_dim]`` in the cache's dtype, raw (bf16/fp16 as their
16-bit patterns): for every layer in order, its K rows then its V rows ``[0, n)`` of the slot.

The runner hands over what the cache needs when it builds it: the slot lengths it shares (one
``SlotLengths`` list, updated by both), its context and its forward (the splice prefills new
tokens through it, held weakly: a runner and its cache never keep each other alive).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import KVSnapshot, MovedChunk
from localinfer.backends.kv_splice import CellMove, Forward, splice_in_place, weak_forward
from localinfer.backends.kv_transfer_checks import (
    check_copy,
    check_restore,
    check_snapshot,
    layout_key,
    model_identity,
)
from localinfer.backends.rope_tables import inverse_frequencies
from localinfer.backends.slot_lengths import SlotLengths
from localinfer.loading.model_config import ModelConfig


@dataclass(slots=True, frozen=True)
class StaticCacheShape:
    """What a static cache is, as its layout key names it."""

    backend: str  # torch | mlx
    dtype: str  # the element type's name: float32, bfloat16, float16
    n_layers: int
    kv_heads: int
    head_dim: int
    element_bytes: int
    quant: str  # the runner's weight form (RunnerInfo.quant)
    config: ModelConfig

    def payload_shape(self, n_tokens: int) -> tuple[int, ...]:
        return (self.n_layers, 2, self.kv_heads, n_tokens, self.head_dim)

    def payload_bytes(self, n_tokens: int) -> int:
        return int(np.prod(self.payload_shape(n_tokens))) * self.element_bytes

    def layout(self, norm_bytes: bytes) -> str:
        """The snapshot compatibility key: the cache's form, the weights' form and the model (its
        config and its final norm's bytes, so two fine-tunes of one architecture differ)."""
        return layout_key(
            self.backend,
            dtype=self.dtype,
            layers=self.n_layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            quant=self.quant,
            model=model_identity(self.config, norm_bytes),
        )


class StaticKV(ABC):
    """KVCache over a static per-layer cache; not thread-safe (the runner's thread owns it)."""

    def __init__(
        self, shape: StaticCacheShape, lengths: SlotLengths, max_ctx: int, forward: Forward
    ) -> None:
        self.shape = shape
        self.max_ctx = max_ctx
        self._lengths = lengths  # the runner's own list: both record what each slot holds
        self._forward = weak_forward(forward)
        self._layout: str | None = None  # worked out on first use (it copies the norm to host)
        self._closed = False

    # -- KVTransfer -------------------------------------------------------------------------

    def layout(self) -> str:
        self._check_open()
        if self._layout is None:
            self._layout = self.shape.layout(self._norm_bytes())
        return self._layout

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Every layer's K/V rows ``[0, n_tokens)`` of ``src`` into ``dst``, same positions."""
        self._check_open()
        check_copy(self._lengths, src, dst, n_tokens)
        self._copy_rows(src, dst, n_tokens)
        self._lengths[dst] = n_tokens

    def snapshot(self, slot: int, n_tokens: int) -> KVSnapshot:
        """The slot's rows ``[0, n_tokens)`` of every layer, copied to host memory as raw bytes."""
        self._check_open()
        check_snapshot(self._lengths, slot, n_tokens)
        payload = self._read_rows(slot, n_tokens)
        return KVSnapshot(layout=self.layout(), n_tokens=n_tokens, payload=payload)

    def restore(self, slot: int, snapshot: KVSnapshot) -> None:
        """The snapshot's rows written at positions ``[0, n)`` of ``slot``; the slot then holds
        exactly them."""
        self._check_open()
        n = snapshot.n_tokens
        size = self.shape.payload_bytes(n)
        check_restore(self._lengths, slot, snapshot, self.layout(), self.max_ctx, size)
        self._write_rows(slot, snapshot.payload, n)
        self._lengths[slot] = n

    # -- KVSplicer --------------------------------------------------------------------------

    def splice(self, slot: int, keep: int, chunks: Sequence[MovedChunk]) -> None:
        """Cached entries moved, keys turned to their new positions (kv_splice.py says why one
        more turn suffices); the moved chunks wait beyond the slot's length while the new tokens
        before each are prefilled (kv_splice.splice_in_place)."""
        self._check_open()
        inv_freq = inverse_frequencies(self.shape.config)
        splice_in_place(
            self._forward,
            lambda s, moves: self._move_cells(s, moves, inv_freq),
            self._lengths,
            self.max_ctx,
            slot,
            keep,
            chunks,
        )

    def close(self) -> None:
        """The runner is closing: drop every reference to its tensors."""
        self._closed = True
        self._release()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("runner is closed")

    # -- the framework's part ---------------------------------------------------------------

    @abstractmethod
    def _norm_bytes(self) -> bytes:
        """The final norm's weights as float32 bytes (part of the model's identity)."""

    @abstractmethod
    def _copy_rows(self, src: int, dst: int, n_tokens: int) -> None:
        """Every layer's K/V rows ``[0, n_tokens)`` of ``src`` into ``dst``."""

    @abstractmethod
    def _read_rows(self, slot: int, n_tokens: int) -> bytes:
        """The payload of ``slot``'s first ``n_tokens`` cells (module doc)."""

    @abstractmethod
    def _write_rows(self, slot: int, payload: bytes, n_tokens: int) -> None:
        """A checked payload of ``n_tokens`` cells written at positions ``[0, n)`` of ``slot``."""

    @abstractmethod
    def _move_cells(self, slot: int, moves: Sequence[CellMove], inv_freq: np.ndarray) -> None:
        """Every move's entries of ``slot`` to their destinations, all reads before any write,
        keys turned by their deltas (``inv_freq``: [head_dim / 2] float64)."""

    @abstractmethod
    def _release(self) -> None:
        """Drop the references to the runner's tensors."""
