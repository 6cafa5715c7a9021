"""``LlamaCppRunner.kv_cache`` (backends/base.py's KVCache) on llama.cpp's sequence state.

Why not ``llama_memory_seq_cp``: the runner's context keeps one KV stream per slot
(``kv_unified = false``), and between streams this llama.cpp copies only whole streams (a partial
range aborts the process), lazily at the next decode, so a snapshot or restore of the target
before then would read or be overwritten by stale cells. Instead a slot's cells are read with
``llama_state_seq_get_data``, taken apart on the host (seq_state.py: cut to a prefix, checked)
and written into the target with ``llama_state_seq_set_data``: a copy costs one host round trip of
the source's cells, and whatever is restored is exactly what the bytes hold.

A payload is seq_state's own form (no stream table; V as the context laid it out, turned only for
a context that lays it out the other way), so a snapshot restores into a runner with another slot
count or flash-attention setting of the same model. Splices are
kv_splice.py's (llama.cpp moves the cells and turns their keys at the next decode).

A model whose RoPE takes several positions a token (M-RoPE: Qwen2-VL and later) gets
:class:`LlamaCppKVCells`, which transfers nothing (``kv_cache_for``): llama.cpp writes such a
cell's row and column beside its position, which seq_state does not read, and a slot that holds
an image keys its cells by positions that are not their indices (mrope.py), so neither a prefix
cut by position nor a copy without the runner's record of its images would be right. The engine
then serves prefix reuse in each slot's own cells and turns the KV tiers off.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.backends.base import KVSnapshot, MovedChunk
from localinfer.backends.kv_splice import Forward, weak_forward
from localinfer.backends.kv_transfer_checks import (
    check_copy,
    check_restore,
    check_snapshot,
    layout_key,
)
from localinfer.backends.llamacpp.cache_types import ggml_type_id
from localinfer.backends.llamacpp.kv_splice import splice_slot
from localinfer.backends.llamacpp.native import model_meta
from localinfer.backends.llamacpp.seq_state import (
    CacheCells,
    LayerCells,
    SeqState,
    from_llama,
    from_payload,
    to_llama,
    to_payload,
)
from localinfer.backends.slot_lengths import SlotLengths
from localinfer.facts.kv_dtype import KVDtype


@dataclass(slots=True, frozen=True)
class LlamaHandles:
    """The llama.cpp objects a runner's KV cache works on; the runner owns and frees them."""

    llama: Any  # llama_cpp's low-level API (native.lib())
    model: Any  # llama_model *
    ctx: Any  # llama_context *
    memory: Any  # the context's llama_memory_t


@dataclass(slots=True)
class SeqFormat:
    """What one runner's sequence states look like; read once, on the first transfer."""

    magic: int  # llama.cpp's state-format magic
    n_caches: int  # KV caches per sequence (2: interleaved sliding-window attention)
    n_stream: int  # KV streams in the context (one per slot)
    n_layer: int
    k_row: int  # bytes of one cell's keys (all KV heads) in one layer, in the cache's type
    v_row: int
    type_id: int  # the K and V cache's ggml type (the runner's --kv-dtype)
    layout: str
    v_trans: bool | None = None  # how the context lays out V; learned from a state it wrote

    @classmethod
    def of(cls, h: LlamaHandles, empty_raw: memoryview, kv: KVDtype, model_path: Path) -> SeqFormat:
        """From ``empty_raw``, a slot's state (the header and stream table come even for an
        empty slot), and the model's facts as llama.cpp reports them."""
        empty = from_llama(empty_raw)
        llama, model = h.llama, h.model
        n_layer = int(llama.llama_model_n_layer(model))
        kv_heads = int(llama.llama_model_n_head_kv(model))
        head = int(llama.llama_model_n_embd(model)) // int(llama.llama_model_n_head(model))
        arch = model_meta(llama, model, "general.architecture") or ""
        k_dim = int(model_meta(llama, model, f"{arch}.attention.key_length") or head)
        v_dim = int(model_meta(llama, model, f"{arch}.attention.value_length") or head)
        k_row, v_row = kv.row_bytes(kv_heads * k_dim), kv.row_bytes(kv_heads * v_dim)
        layout = layout_key(
            "llamacpp",
            kv=kv.name,
            layers=n_layer,
            kv_heads=kv_heads,
            k_row=k_row,
            v_row=v_row,
            state=f"{empty.magic:08x}",
            model=_model_identity(h, model_path),
        )
        n_stream = int(np.frombuffer(empty_raw, "<u4", count=1, offset=8)[0])
        caches, type_id = len(empty.caches), ggml_type_id(kv)
        return cls(empty.magic, caches, n_stream, n_layer, k_row, v_row, type_id, layout)


class LlamaCppKVCells:
    """The splicing part of a LlamaCppRunner's KV cache (KVSplicer), all of it for a model whose
    cells cannot be transferred (module doc). ``cells_moved``: a splice moved cells whose keys
    llama.cpp turns at the next decode (the runner clears it after each decode); until then
    their bytes are not turned, so no transfer may read them."""

    def __init__(
        self,
        handles: LlamaHandles,
        lengths: SlotLengths,
        max_ctx: int,
        kv_type: KVDtype,
        model_path: Path,
        forward: Forward,
    ) -> None:
        """``lengths`` and ``forward``: the runner's (the splice prefills through it)."""
        self._handles: LlamaHandles | None = handles
        self._lengths = lengths
        self.max_ctx = max_ctx
        self._kv_type = kv_type
        self._model_path = model_path
        self._forward = weak_forward(forward)
        self._format: SeqFormat | None = None  # made on the first transfer
        self.cells_moved = False

    def splice(self, slot: int, keep: int, chunks: Sequence[MovedChunk]) -> None:
        """Cells moved by llama.cpp (kv_splice.py)."""
        h = self._open()
        splice_slot(
            h.llama, h.memory, self._lengths, self.max_ctx, self._forward, slot, keep, chunks
        )
        self.cells_moved = self.cells_moved or bool(chunks)

    def close(self) -> None:
        """The runner is freeing its context: nothing here may touch it again."""
        self._handles = None

    def _open(self) -> LlamaHandles:
        if self._handles is None:
            raise RuntimeError("this LlamaCppRunner is closed")
        return self._handles


class LlamaCppKVCache(LlamaCppKVCells):
    """KVCache of a LlamaCppRunner's context: its cells also copied between slots, and to host
    memory and back (KVTransfer)."""

    # -- KVTransfer -------------------------------------------------------------------------

    def layout(self) -> str:
        return self._seq_format().layout

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        self._open()
        check_copy(self._lengths, src, dst, n_tokens)
        self._write(dst, self._cells(src, n_tokens))

    def snapshot(self, slot: int, n_tokens: int) -> KVSnapshot:
        self._open()
        check_snapshot(self._lengths, slot, n_tokens)
        payload = to_payload(self._cells(slot, n_tokens))
        return KVSnapshot(layout=self._seq_format().layout, n_tokens=n_tokens, payload=payload)

    def restore(self, slot: int, snapshot: KVSnapshot) -> None:
        fmt = self._seq_format()
        check_restore(self._lengths, slot, snapshot, fmt.layout, self.max_ctx, None)
        state = from_payload(snapshot.payload)
        _check_cells(fmt, state, snapshot.n_tokens)
        self._write(slot, state)

    # -- internals --------------------------------------------------------------------------

    def _seq_format(self) -> SeqFormat:
        h = self._open()
        if self._format is None:
            lengths = self._lengths
            shortest = min(range(len(lengths)), key=lengths.__getitem__)
            self._format = SeqFormat.of(h, self._read(shortest), self._kv_type, self._model_path)
        return self._format

    def _cells(self, slot: int, n_tokens: int) -> SeqState:
        """The slot's first ``n_tokens`` cells, checked to be what the runner says it holds."""
        if self.cells_moved:
            # llama.cpp turns moved keys at the next decode; their bytes are not turned yet.
            raise RuntimeError(f"slot {slot}: cells moved by a splice; decode before a transfer")
        fmt = self._seq_format()
        state = from_llama(self._read(slot))
        fmt.v_trans = state.v_trans
        length = self._lengths[slot]
        _check_cells(fmt, state, length)
        if n_tokens < length:
            if not all(c.holds_every_position() for c in state.caches):
                raise NotImplementedError(
                    "a sliding-window KV cache holds only its last cells: it cannot be cut to a "
                    "prefix (copy or snapshot the whole slot)"
                )
            state = state.prefix(n_tokens)
        return state

    def _read(self, slot: int) -> memoryview:
        h = self._open()
        size = int(h.llama.llama_state_seq_get_size(h.ctx, slot))
        buf = np.empty(size, np.uint8)  # llama.cpp writes every byte: no zeroing first
        dst = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if int(h.llama.llama_state_seq_get_data(h.ctx, dst, size, slot)) != size:
            raise RuntimeError(f"llama.cpp could not read slot {slot}'s state")
        return memoryview(buf)

    def _write(self, slot: int, state: SeqState) -> None:
        """``slot`` made to hold exactly ``state``'s cells. The V orientation this context wants
        is learned from a state it wrote; until then (every slot empty, the target too) a refused
        guess is retried the other way."""
        h, fmt, lengths = self._open(), self._seq_format(), self._lengths
        if fmt.v_trans is None:
            busy = [s for s in range(len(lengths)) if lengths[s]]
            if busy:
                fmt.v_trans = from_llama(self._read(busy[0])).v_trans
        guesses = [fmt.v_trans] if fmt.v_trans is not None else [False, True]
        lengths[slot] = 0  # llama.cpp drops the slot's cells first, whatever follows
        for v_trans in guesses:
            data = to_llama(state, slot, fmt.n_stream, bool(v_trans))
            src = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
            if int(h.llama.llama_state_seq_set_data(h.ctx, src, len(data), slot)) == len(data):
                fmt.v_trans = v_trans
                lengths[slot] = len(state.caches[0].positions)
                return
        h.llama.llama_memory_seq_rm(h.memory, slot, -1, -1)
        raise RuntimeError(f"llama.cpp refused to restore slot {slot}'s state")


def kv_cache_for(
    handles: LlamaHandles,
    lengths: SlotLengths,
    max_ctx: int,
    kv_type: KVDtype,
    model_path: Path,
    forward: Forward,
) -> LlamaCppKVCells:
    """The runner's ``kv_cache``: a LlamaCppKVCache, or LlamaCppKVCells for a model whose RoPE
    takes several positions a token (module doc)."""
    llama = handles.llama
    several = (llama.LLAMA_ROPE_TYPE_MROPE, llama.LLAMA_ROPE_TYPE_IMROPE)
    multi = int(llama.llama_model_rope_type(handles.model)) in several
    kind = LlamaCppKVCells if multi else LlamaCppKVCache
    return kind(handles, lengths, max_ctx, kv_type, model_path, forward)


def repeated_cells(seed: KVSnapshot, n_tokens: int) -> KVSnapshot:
    """``seed``'s cells repeated to ``n_tokens`` cells at positions 0..n-1 (measurements only)."""
    state = from_payload(seed.payload)
    reps = -(-n_tokens // len(state.caches[0].positions))

    def grow(x: LayerCells) -> LayerCells:
        k, v = (np.tile(rows, (reps, 1))[:n_tokens] for rows in (x.k, x.v_as(False)))
        return LayerCells(x.k_type, k, x.v_type, x.v_element, v)

    positions = np.arange(n_tokens, dtype=np.int32)
    state.caches = [CacheCells(positions, [grow(x) for x in c.layers]) for c in state.caches]
    return KVSnapshot(layout=seed.layout, n_tokens=n_tokens, payload=to_payload(state))


def _check_cells(fmt: SeqFormat, state: SeqState, n_tokens: int) -> None:
    """ValueError unless ``state`` is ``n_tokens`` cells of this runner's caches: rows of
    its type and sizes, every layer once, positions ``0..n-1`` (a sliding window: its last ones)."""
    if state.magic != fmt.magic or len(state.caches) != fmt.n_caches:
        raise ValueError("KV payload: not this llama.cpp's state format")
    if sum(len(c.layers) for c in state.caches) != fmt.n_layer:
        raise ValueError(f"KV payload: layers do not add up to {fmt.n_layer}")
    rows = (fmt.type_id, fmt.type_id, fmt.k_row, fmt.v_row)
    for cache in state.caches:
        pos = cache.positions
        full = cache.holds_every_position() and len(pos) == n_tokens
        window = len(pos) > 0 and len(np.unique(pos)) == len(pos) and pos.max() == n_tokens - 1
        if not (full or (fmt.n_caches > 1 and window)):
            raise ValueError(f"KV payload: its cells are not positions 0..{n_tokens - 1}")
        if any((x.k_type, x.v_type, x.k.shape[1], x.v_row) != rows for x in cache.layers):
            raise ValueError("KV payload: rows of another type or size")


def _model_identity(h: LlamaHandles, model_path: Path) -> str:
    """llama.cpp's description of the model, its parameter count, and a hash of the file's
    size, head (metadata) and tail (the last tensors' bytes): enough to tell two fine-tunes of
    one architecture apart without reading the whole file."""
    llama, model = h.llama, h.model
    desc = ctypes.create_string_buffer(256)
    llama.llama_model_desc(model, desc, len(desc))
    path = Path(model_path)
    digest = hashlib.sha256()
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            digest.update(str(size).encode() + f.read(1 << 16))
            f.seek(max(0, size - (1 << 20)))
            digest.update(f.read())
    except OSError:  # the file went away after loading: the description must do
        digest.update(b"file unreadable")
    name = desc.value.decode("utf-8", errors="replace").replace(" ", "_").replace(";", ",")
    return f"{name}-{int(llama.llama_model_n_params(model))}-{digest.hexdigest()[:12]}"
