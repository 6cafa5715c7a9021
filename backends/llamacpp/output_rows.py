"""Copying per-row outputs (logits, embeddings) out of llama.cpp's buffers."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np


def copy_output_rows(
    row_pointer: Callable[[int], Any], rows: np.ndarray, width: int, what: str
) -> np.ndarray:
    """float32 ``[len(rows), width]`` of the batch rows ``rows`` (flagged as outputs,
    ascending); ``row_pointer(i)`` is llama.cpp's ``llama_get_{logits,embeddings}_ith``."""
    n = len(rows)
    if n == 0:
        return np.empty((0, width), dtype=np.float32)
    first = row_pointer(int(rows[0]))
    if not first:
        raise RuntimeError(f"llama.cpp has no {what} for batch row {rows[0]}")
    if n > 1:
        # After llama.cpp reorders its outputs they follow batch order, so the rows are
        # contiguous; check the last row's address rather than trust it.
        last = row_pointer(int(rows[-1]))
        expect = ctypes.addressof(first.contents) + (n - 1) * width * 4
        if not last or ctypes.addressof(last.contents) != expect:
            return np.concatenate(
                [copy_output_rows(row_pointer, rows[k : k + 1], width, what) for k in range(n)]
            )
    return np.ctypeslib.as_array(first, shape=(n, width)).copy()  # [n, width]


def output_row_view(pointer: Any, width: int, what: str, row: int) -> np.ndarray:
    """float32 ``[width]``: a view, not a copy, of batch row ``row``'s output in llama.cpp's
    buffer (valid until the next decode); ``pointer`` is what ``llama_get_{logits,embeddings}_ith``
    returned for it."""
    if not pointer:
        raise RuntimeError(f"llama.cpp has no {what} for batch row {row}")
    # A ctypes array at the address: np.ctypeslib.as_array builds the same view through several
    # Python calls, which take tens of microseconds of a decode step with the caches just cooled.
    row_type = _float_rows(width)
    return np.frombuffer(row_type.from_address(ctypes.addressof(pointer.contents)), np.float32)


@functools.cache
def _float_rows(width: int) -> type[ctypes.Array]:
    return ctypes.c_float * width
