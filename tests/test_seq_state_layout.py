"""backends/llamacpp/seq_state.py's V transposition: llama.cpp's element-major V layout (no flash
attention) and the payload's one-row-per-cell form turn into each other exactly, for every item
size, from contiguous arrays and from the strided views a prefix cut leaves."""

from __future__ import annotations

import numpy as np
import pytest

from backends.llamacpp.seq_state import transposed


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
