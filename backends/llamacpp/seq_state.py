"""llama.cpp's per-sequence state bytes (``llama_state_seq_get_data``) taken apart and rebuilt.

What this llama.cpp writes for one sequence: a header (u32 state magic, i32 the sequence's id),
then for each of the model's KV caches (one; two for interleaved sliding-window models, base then
SWA) a section: u32 ``n_stream``, then per stream a u32 cell count and, where it is not 0, the
cells' metadata (i32 position, u32 1, i32 seq id each), u32 ``v_trans``, u32 layer count, every
layer's keys (i32 type, u64 row bytes, one row per cell) and every layer's values: the same,
or with ``v_trans`` (no flash attention) i32 type, u32 element bytes, u32 elements per row, then
element-major data (``[row elements, cells, element]``).

:class:`SeqState` holds those cells as views of the bytes they came in, with V in either
orientation (``LayerCells.by_element``), so a state can be cut to a prefix on the host,
validated before llama.cpp sees it, kept in a compact payload of our own (:func:`to_payload`)
and written back for a context with any stream count and V orientation (:func:`to_llama`). V is
turned only where the orientations differ (a snapshot restored into a runner with the other
flash-attention setting): a slot's state goes out and back in with one copy each way, which is
what a wave of requests restored from the RAM tier waits on (the engine thread does it between
forwards)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

PAYLOAD_MAGIC = b"LIKV"
PAYLOAD_VERSION = 2  # 2: a V orientation flag per layer (1: V always one row per cell)
ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}  # ggml F32, F16, BF16: the types a V cache can transpose
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def transposed(a: np.ndarray, rows: int, cols: int, element: int) -> np.ndarray:
    """``a``'s bytes read as a ``[rows, cols]`` matrix of ``element``-byte items, transposed:
    a contiguous ``[cols, rows * element]`` uint8 array. The items are moved as whole machine
    words (a uint16 matrix for F16), several times faster than moving their bytes as a third
    axis; the engine thread does this for every KV copy, snapshot and restore."""
    word = _WORDS.get(element)
    if word is None:  # no machine word of that size: bytes as a third axis
        items = a.reshape(rows, cols, element).transpose(1, 0, 2)
        return np.ascontiguousarray(items).reshape(cols, rows * element)
    matrix = np.ascontiguousarray(a).view(word).reshape(rows, cols)
    return np.ascontiguousarray(matrix.T).view(np.uint8).reshape(cols, rows * element)


@dataclass(slots=True)
class LayerCells:
    k_type: int  # ggml type id
    k: np.ndarray  # [cells, k row bytes] uint8
    v_type: int
    v_element: int  # bytes per V element, to turn rows into llama.cpp's transposed layout
    v: np.ndarray  # [cells, v row bytes] uint8; by_element: [v row elements, cells * v_element]
    by_element: bool = False  # V as llama.cpp lays it out without flash attention

    @property
    def cells(self) -> int:
        return self.k.shape[0]

    @property
    def v_row(self) -> int:
        """Bytes of one cell's values."""
        return self.v.shape[0] * self.v_element if self.by_element else self.v.shape[1]

    def v_as(self, by_element: bool) -> np.ndarray:
        """V in the orientation asked: a view where it is already so, else turned (a copy)."""
        if by_element == self.by_element:
            return self.v
        if not self.v_element or self.v_row % self.v_element:
            raise ValueError(f"V cache type {self.v_type} cannot be laid out transposed")
        width = self.v_row // self.v_element
        if self.by_element:
            return transposed(self.v, width, self.cells, self.v_element)
        return transposed(self.v, self.cells, width, self.v_element)

    def take(self, keep: np.ndarray | slice) -> LayerCells:
        """Only the cells ``keep`` (indices, or a slice: then views, no copy)."""
        v = self.v
        if self.by_element:
            width, element = v.shape[0], self.v_element
            v = v.reshape(width, self.cells, element)[:, keep].reshape(width, -1)
        else:
            v = v[keep]
        k = self.k[keep]
        return LayerCells(self.k_type, k, self.v_type, self.v_element, v, self.by_element)


@dataclass(slots=True)
class CacheCells:
    """One KV cache's cells of a sequence, in the order the context held them (attention sums
    over cells in that order, so a copy that keeps it gives bit-identical results)."""

    positions: np.ndarray  # [cells] int32
    layers: list[LayerCells]

    def take(self, keep: np.ndarray) -> CacheCells:
        """Only the cells where the boolean mask ``keep`` is set, in their order."""
        (index,) = np.nonzero(keep)
        cells: np.ndarray | slice = index
        if len(index) == 0 or index[-1] == len(index) - 1:  # the first cells: views of them
            cells = slice(0, len(index))
        return CacheCells(self.positions[cells], [x.take(cells) for x in self.layers])

    def holds_every_position(self) -> bool:
        """Positions ``0..cells-1`` each once: a full cache, not a sliding window's last cells."""
        return bool(np.array_equal(np.sort(self.positions), np.arange(len(self.positions))))


@dataclass(slots=True)
class SeqState:
    magic: int  # llama.cpp's sequence-state magic: which state format this llama.cpp writes
    caches: list[CacheCells]
    v_trans: bool | None = None  # how the context it came from lays out V (None: not known)

    def prefix(self, n_tokens: int) -> SeqState:
        """Only the cells at positions below ``n_tokens``."""
        caches = [c.take(c.positions < n_tokens) for c in self.caches]
        return SeqState(self.magic, caches, self.v_trans)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = memoryview(data), 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"KV payload truncated at byte {self.at} (needs {n} more)")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def num(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def array(self, rows: int, row_bytes: int) -> np.ndarray:
        return np.frombuffer(self.take(rows * row_bytes), np.uint8).reshape(rows, row_bytes)

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def from_llama(data: bytes) -> SeqState:
    """Parse what ``llama_state_seq_get_data`` wrote for one sequence."""
    r = _Reader(data)
    magic = r.num("I")
    r.num("i")  # the sequence id it was taken from: restores name their own
    state = SeqState(magic, [])
    while not r.done:
        found: CacheCells | None = None
        for _ in range(r.num("I")):  # streams
            count = r.num("I")
            if count == 0:
                continue
            if found is not None:
                raise ValueError("a sequence's cells in two KV streams")
            found = _read_cells(r, count, state)
        state.caches.append(found or CacheCells(np.zeros(0, np.int32), []))
    return state


def _read_cells(r: _Reader, count: int, state: SeqState) -> CacheCells:
    meta = np.frombuffer(r.take(count * 12), np.int32).reshape(count, 3)  # pos, n_seq (1), seq
    if not (meta[:, 1] == 1).all():
        raise ValueError("a KV cell shared by several sequences in a single-sequence state")
    v_trans, n_layer = r.num("I"), r.num("I")
    state.v_trans = bool(v_trans)
    keys = []
    for _ in range(n_layer):
        k_type, row = r.num("i"), r.num("Q")
        keys.append((k_type, r.array(count, row)))
    layers = []
    for k_type, k in keys:
        v_type = r.num("i")
        if v_trans:
            element, width = r.num("I"), r.num("I")
            v = r.array(width, count * element)  # [row elements, cells * element bytes]
        else:
            row = r.num("Q")
            v = r.array(count, row)
            element = ELEMENT_BYTES.get(v_type, 0)  # 0: a type that cannot be transposed
        layers.append(LayerCells(k_type, k, v_type, element, v, bool(v_trans)))
    return CacheCells(meta[:, 0].copy(), layers)


def to_llama(state: SeqState, seq: int, n_stream: int, v_trans: bool) -> bytes:
    """What ``llama_state_seq_set_data`` reads into sequence ``seq`` of a context with
    ``n_stream`` KV streams and this V orientation: one join of the cells' bytes."""
    out: list[bytes | memoryview] = [struct.pack("<Ii", state.magic, seq)]
    for cache in state.caches:
        count = len(cache.positions)
        out.append(struct.pack("<II", n_stream, count))
        if count:
            meta = np.empty((count, 3), np.int32)
            meta[:, 0], meta[:, 1], meta[:, 2] = cache.positions, 1, seq
            out += [meta.tobytes(), struct.pack("<II", int(v_trans), len(cache.layers))]
            for x in cache.layers:
                out += [struct.pack("<iQ", x.k_type, x.k.shape[1]), _bytes(x.k)]
            for x in cache.layers:
                v = _bytes(x.v_as(v_trans))
                if v_trans:
                    width = x.v_row // x.v_element
                    out += [struct.pack("<iII", x.v_type, x.v_element, width), v]
                else:
                    out += [struct.pack("<iQ", x.v_type, x.v_row), v]
        out.append(b"\0\0\0\0" * (n_stream - 1))  # the other streams: no cells
    return b"".join(out)


def _flag(value: int) -> bool:
    if value not in (0, 1):
        raise ValueError(f"KV payload: a V orientation flag of {value}")
    return value == 1


def _bytes(a: np.ndarray) -> memoryview:
    """``a``'s bytes for a join, without a copy where it is contiguous (views of the state)."""
    return np.ascontiguousarray(a).data.cast("B")


def to_payload(state: SeqState) -> bytes:
    """Our own compact form: no stream table; V as it came (a flag per layer says how)."""
    out: list[bytes | memoryview] = [
        PAYLOAD_MAGIC,
        struct.pack("<III", PAYLOAD_VERSION, state.magic, len(state.caches)),
    ]
    for cache in state.caches:
        out += [struct.pack("<II", len(cache.positions), len(cache.layers))]
        out.append(cache.positions.astype("<i4").tobytes())
        for x in cache.layers:
            head = (x.k_type, x.k.shape[1], x.v_type, x.v_element, x.v_row, int(x.by_element))
            out += [struct.pack("<iIiIII", *head), _bytes(x.k), _bytes(x.v)]
    return b"".join(out)


def from_payload(data: bytes) -> SeqState:
    """Parse :func:`to_payload`'s bytes (this version's or version 1's, which the disk tier may
    still hold); ValueError for anything short, long or malformed."""
    r = _Reader(data)
    if bytes(r.take(4)) != PAYLOAD_MAGIC:
        raise ValueError("not a llama.cpp KV payload")
    version = r.num("I")
    if version not in (1, PAYLOAD_VERSION):
        raise ValueError(f"a llama.cpp KV payload of version {version}, not {PAYLOAD_VERSION}")
    magic, n_caches = r.num("I"), r.num("I")
    caches = []
    for _ in range(n_caches):
        count, n_layer = r.num("I"), r.num("I")
        positions = np.frombuffer(r.take(count * 4), "<i4").astype(np.int32)
        layers = []
        for _ in range(n_layer):
            k_type, k_row, v_type, v_element, v_row = struct.unpack("<iIiII", r.take(20))
            by_element = version > 1 and _flag(r.num("I"))
            k = r.array(count, k_row)
            if by_element:
                if not v_element or v_row % v_element:
                    raise ValueError("KV payload: a transposed V of an impossible element size")
                v = r.array(v_row // v_element, count * v_element)
            else:
                v = r.array(count, v_row)
            layers.append(LayerCells(k_type, k, v_type, v_element, v, by_element))
        caches.append(CacheCells(positions, layers))
    if not r.done:
        raise ValueError(f"KV payload has {len(data) - r.at} bytes past its end")
    return SeqState(magic, caches)
