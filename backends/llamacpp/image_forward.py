"""A forward whose work holds images, on the llama.cpp runner.

A ``SlotWork`` with ``images`` is cut into its text pieces and image pieces (``segments``), fed in
order, so every token attends to what precedes it: the text pieces through the runner's own
token forward, each image piece as embeddings (``llama_batch.embd``) at its positions, computed
by the projector (vision.py). Only the item's last piece joins the step's batch with the other
slots (or, an image, gives the item's row itself), so the engine gets one row per item as for
text.

An image piece is decoded alone, in calls of at most ``n_batch`` rows like mtmd's own helper
(``mtmd_helper_decode_image_chunk``), with causal attention off where the projector wants its
image tokens to see each other both ways (Gemma 3): llama.cpp's switch is the context's, not a
row's. The engine never splits an image between two steps (``image_safe_end``); a piece that
starts inside an image (a cached prefix ending there) is fed from that row on. An image placed by
M-RoPE (Qwen2-VL) gets four positions a row from its first, the slot's next position, and is
recorded in the runner's SlotPositions (mrope.py), so the text after it goes on from there; such
an image is only ever fed whole (a slot is never cut inside one).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from localinfer.backends.base import PromptImage, RunnerConfig, SlotWork
from localinfer.backends.llamacpp.mrope import SlotPositions
from localinfer.backends.llamacpp.output_rows import copy_output_rows
from localinfer.backends.llamacpp.sampling import SlotSamplers
from localinfer.backends.llamacpp.vision import LlamaCppVision

TextForward = Callable[[Sequence[SlotWork]], list[np.ndarray]]


@dataclass(slots=True, frozen=True)
class Segment:
    """Positions ``[start, start + n)`` of one item: text ``tokens``, or rows ``[lo, hi)`` of
    ``image``."""

    start: int
    tokens: tuple[int, ...] = ()
    image: PromptImage | None = None
    lo: int = 0
    hi: int = 0


def segments(work: SlotWork) -> list[Segment]:
    """The item's text and image pieces, in order."""
    begin, end = work.start_pos, work.start_pos + len(work.tokens)
    out: list[Segment] = []
    at = begin
    for image in sorted(work.images, key=lambda i: i.start):
        lo, hi = max(image.start, at), min(image.end, end)
        if hi <= lo:
            continue
        if lo > at:
            out.append(Segment(at, work.tokens[at - begin : lo - begin]))
        out.append(Segment(lo, image=image, lo=lo - image.start, hi=hi - image.start))
        at = hi
    if at < end:
        out.append(Segment(at, work.tokens[at - begin :]))
    return out


class EmbeddingBatch:
    """A llama_batch of embedding rows (``embd`` set, ``token`` NULL) for one sequence; each
    row has ``sections`` positions (4 with M-RoPE, laid out section by section)."""

    def __init__(self, llama: ModuleType, n_batch: int, sections: int = 1) -> None:
        self.capacity = n_batch
        self.pos = np.zeros(n_batch * sections, dtype=np.int32)
        self.n_seq_id = np.ones(n_batch, dtype=np.int32)
        self.seq = np.zeros((n_batch, 1), dtype=np.int32)
        self.logits = np.zeros(n_batch, dtype=np.int8)
        seq_ptr_t = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (seq_ptr_t * n_batch)(
            *[ctypes.cast(self.seq.ctypes.data + i * 4, seq_ptr_t) for i in range(n_batch)]
        )
        batch = llama.llama_batch()
        batch.token = None
        batch.pos = self.pos.ctypes.data_as(seq_ptr_t)
        batch.n_seq_id = self.n_seq_id.ctypes.data_as(seq_ptr_t)
        batch.seq_id = self._seq_ptrs
        batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.batch = batch
        self._rows: np.ndarray | None = None  # referenced while the batch points at it

    def fill(self, rows: np.ndarray, positions: np.ndarray, slot: int, want_last: bool) -> None:
        """``positions``: ``[sections, len(rows)]``."""
        n = len(rows)
        self._rows = np.ascontiguousarray(rows, dtype=np.float32)
        self.batch.embd = self._rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.pos[: positions.size] = positions.reshape(-1)
        self.seq[:n, 0] = slot
        self.logits[:n] = 0
        self.logits[n - 1] = int(want_last)
        self.batch.n_tokens = n


class ImageFeeder:
    """Feeds images into the runner's context; owns the projector (``vision``)."""

    def __init__(
        self,
        vision: LlamaCppVision,
        handles: Any,  # kv_cache.LlamaHandles: llama, model, ctx
        lengths: SlotPositions,
        n_batch: int,
        samplers: SlotSamplers,
        kv_cache: Any,  # the runner's LlamaCppKVCache: a decode clears its ``cells_moved``
    ) -> None:
        self.vision = vision
        self._llama, self._ctx, self._lengths = handles.llama, handles.ctx, lengths
        self._vocab = int(handles.llama.llama_vocab_n_tokens(
            handles.llama.llama_model_get_vocab(handles.model)))  # fmt: skip
        self._batch = EmbeddingBatch(handles.llama, n_batch, 4 if vision.mrope else 1)
        self._samplers, self._kv_cache = samplers, kv_cache

    @classmethod
    def load(
        cls,
        config: RunnerConfig,
        handles: Any,
        lengths: SlotPositions,
        n_batch: int,
        threads: int,
        samplers: SlotSamplers,
        kv_cache: Any,
        on_failure: Callable[[], None],
    ) -> ImageFeeder | None:
        """The feeder of the projector ``config.mmproj`` names; None without one. When the
        projector cannot load, ``on_failure`` (the runner's close) runs before the error goes on,
        so a model loaded for nothing is freed at once."""
        if config.mmproj is None:
            return None
        gpu = config.device != "cpu"
        try:
            vision = LlamaCppVision(handles.llama, handles.model, Path(config.mmproj), threads, gpu)
        except Exception:
            on_failure()
            raise
        return cls(vision, handles, lengths, n_batch, samplers, kv_cache)

    def add_memory(self, weights: int, overhead: int) -> tuple[int, int]:
        """The runner's measured weights and overhead with the projector's added: its tensors,
        its compute buffer (both from mtmd's log) and the embeddings kept."""
        vision = self.vision
        extra = vision.compute_bytes + vision.cached_bytes()
        return weights + vision.weight_bytes, overhead + extra

    def forward(self, batch: Sequence[SlotWork], text_forward: TextForward) -> list[np.ndarray]:
        """Each item's result, in batch order (the runner's ``forward`` for a batch with
        images); the items' last text pieces share one token forward."""
        results: list[np.ndarray | None] = [None] * len(batch)
        last_text: list[tuple[int, SlotWork]] = []
        for i, work in enumerate(batch):
            if not work.images:
                last_text.append((i, work))
                continue
            if work.logits != "last":
                raise ValueError("a piece of a prompt with images gives its last row only")
            pieces = segments(work)
            for piece in pieces[:-1]:
                self._feed(work.slot, piece, text_forward, want=False)
            final = pieces[-1]
            if final.image is None:
                item = SlotWork(work.slot, final.tokens, final.start, sample=work.sample)
                last_text.append((i, item))
            else:
                results[i] = self._output(work, self._feed(work.slot, final, text_forward, True))
        if last_text:
            outputs = text_forward([work for _, work in last_text])
            for (i, _), out in zip(last_text, outputs, strict=True):
                results[i] = out
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _feed(self, slot: int, piece: Segment, text_forward: TextForward, want: bool) -> int:
        """Feed one piece; returns the row (of the last decode call) that holds its last output."""
        if piece.image is None:
            text_forward([SlotWork(slot, piece.tokens, piece.start)])
            return -1
        rows = self.vision.encode(piece.image)[piece.lo : piece.hi]
        positions = self._positions(slot, piece)
        llama, step = self._llama, self._batch.capacity
        if self.vision.non_causal:
            llama.llama_set_causal_attn(self._ctx, False)
        try:
            for offset in range(0, len(rows), step):
                part = rows[offset : offset + step]
                last = offset + step >= len(rows)
                at = positions[:, offset : offset + len(part)]
                self._batch.fill(part, at, slot, want and last)
                rc = llama.llama_decode(self._ctx, self._batch.batch)
                self._kv_cache.cells_moved = False  # the decode turned any moved keys first
                if rc != 0:
                    # An M-RoPE image's rows share one position: it goes whole.
                    keep = piece.start if self.vision.mrope else self._lengths[slot]
                    memory = llama.llama_get_memory(self._ctx)
                    llama.llama_memory_seq_rm(memory, slot, self._lengths.position(slot, keep), -1)
                    self._lengths[slot] = keep
                    raise RuntimeError(f"llama_decode failed with code {rc} on an image")
                self._lengths[slot] = piece.start + offset + len(part)
        finally:
            if self.vision.non_causal:
                llama.llama_set_causal_attn(self._ctx, True)
        return (len(rows) - 1) % step

    def _positions(self, slot: int, piece: Segment) -> np.ndarray:
        """The piece's rows' positions, ``[sections, rows]``; an M-RoPE image is recorded in
        the slot's positions first (module doc)."""
        image = piece.image
        assert image is not None
        if not self.vision.mrope:
            return np.arange(piece.start, piece.start + piece.hi - piece.lo, dtype=np.int32)[None]
        if (piece.lo, piece.hi) != (0, image.n_tokens):
            raise ValueError("an image placed by M-RoPE is fed whole, not rows of it")
        positions = self.vision.positions(image, self._lengths.end(slot))
        self._lengths.add_image(slot, piece.start, image.n_tokens, self.vision.n_pos(image))
        return positions

    def _output(self, work: SlotWork, row: int) -> np.ndarray:
        """An item's result from ``row`` of the last decode call: its drawn token, or logits."""
        if work.sample is not None:
            token = self._samplers.sample(self._ctx, work.slot, work.sample, row)
            return np.array([token], dtype=np.int64)
        rows = np.array([row], dtype=np.int64)
        logits = lambda i: self._llama.llama_get_logits_ith(self._ctx, i)  # noqa: E731
        return copy_output_rows(logits, rows, self._vocab, "logits")

    def close(self) -> None:
        self.vision.close()
