"""backends/llamacpp/seq_state.py's V layouts: llama.cpp's element-major V (no flash attention) and
one row per cell turn into each other exactly, for every item size, from contiguous arrays and
from the strided views a prefix cut leaves; a payload keeps V as it came and reads back the same
cells, version-1 payloads included."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from backends.llamacpp.seq_state import (
    PAYLOAD_MAGIC,
    CacheCells,
    LayerCells,
    SeqState,
    from_payload,
    to_llama,
    to_payload,
    transposed,
)


def _reference(a: np.ndarray, rows: int, cols: int, element: int) -> np.ndarray:
    return a.reshape(rows, cols, element).transpose(1, 0, 2).reshape(cols, rows * element)


@pytest.mark.parametrize("element", [1, 2, 3, 4, 8])
def test_transposed_moves_whole_items(element: int) -> None:
    rng = np.random.default_rng(element)
    rows, cols = 7, 5
    a = rng.integers(0, 256, (rows, cols * element), dtype=np.uint8)
    got = transposed(a, rows, cols, element)
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, _reference(a, rows, cols, element))
    # and back: the transposed matrix transposed again is the original
    np.testing.assert_array_equal(transposed(got, cols, rows, element), a)


def test_transposed_reads_a_strided_view() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (10, 12), dtype=np.uint8)[::2]  # every other cell, as a cut leaves
    np.testing.assert_array_equal(transposed(a, 5, 6, 2), _reference(a, 5, 6, 2))


def _state(by_element: bool, cells: int = 6, width: int = 4, element: int = 2) -> SeqState:
    """A one-cache, two-layer state with random rows, V laid out as asked."""
    rng = np.random.default_rng(cells)
    layers = []
    for _ in range(2):
        k = rng.integers(0, 256, (cells, 8), dtype=np.uint8)
        v = rng.integers(0, 256, (cells, width * element), dtype=np.uint8)
        if by_element:
            v = transposed(v, cells, width, element)
        layers.append(LayerCells(1, k, 1, element, v, by_element))
    return SeqState(0x12345678, [CacheCells(np.arange(cells, dtype=np.int32), layers)])


def _rows(state: SeqState) -> list[tuple[bytes, bytes]]:
    return [(x.k.tobytes(), x.v_as(False).tobytes()) for c in state.caches for x in c.layers]


@pytest.mark.parametrize("by_element", [False, True])
def test_a_payload_keeps_v_as_it_came_and_reads_back_the_same_cells(by_element: bool) -> None:
    state = _state(by_element)
    back = from_payload(to_payload(state))
    assert [x.by_element for x in back.caches[0].layers] == [by_element, by_element]
    assert _rows(back) == _rows(state)
    # and written for either context orientation, the llama.cpp bytes are those of the other form
    other = _state(not by_element)
    for v_trans in (False, True):
        assert to_llama(back, 3, 2, v_trans) == to_llama(other, 3, 2, v_trans)


@pytest.mark.parametrize("by_element", [False, True])
def test_a_prefix_cut_keeps_the_first_cells_in_either_orientation(by_element: bool) -> None:
    state = _state(by_element)
    cut = state.prefix(4)
    assert _rows(cut) == [(k[: 4 * 8], v[: 4 * 8]) for k, v in _rows(state)]
    # a cut that is not the first cells (a sliding window's order) takes the right ones too
    keep = np.array([False, True, False, True, True, False])
    taken = state.caches[0].take(keep)
    rows = _rows(SeqState(state.magic, [taken]))
    whole = _rows(state)
    for (k, v), (k0, v0) in zip(rows, whole, strict=True):
        picks = [1, 3, 4]
        assert k == b"".join(k0[i * 8 : i * 8 + 8] for i in picks)
        assert v == b"".join(v0[i * 8 : i * 8 + 8] for i in picks)


def test_a_version_1_payload_still_reads() -> None:
    # Version 1 (the disk tier may hold such files): no orientation flag, V one row per cell.
    state = _state(False)
    cache = state.caches[0]
    head = [PAYLOAD_MAGIC, struct.pack("<III", 1, state.magic, 1)]
    head += [struct.pack("<II", 6, 2), cache.positions.astype("<i4").tobytes()]
    for x in cache.layers:
        head += [struct.pack("<iIiII", x.k_type, 8, x.v_type, 2, 8), x.k.tobytes(), x.v.tobytes()]
    assert _rows(from_payload(b"".join(head))) == _rows(state)


def test_a_bad_orientation_flag_is_refused() -> None:
    payload = bytearray(to_payload(_state(True)))
    # the first layer's flag: after magic, the 12-byte header, counts (8), positions (24), then
    # five header fields (20 bytes)
    at = 4 + 12 + 8 + 24 + 20
    assert payload[at : at + 4] == b"\1\0\0\0"
    payload[at : at + 4] = b"\7\0\0\0"
    with pytest.raises(ValueError, match="orientation flag"):
        from_payload(bytes(payload))
