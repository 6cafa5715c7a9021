"""N-gram lookup ("prompt lookup decoding"): no model, just the tokens seen so far.

The last n tokens are searched for earlier in the prompt + output; the tokens that followed the
most recent earlier occurrence are the proposal. Longer suffixes are tried first (they predict
better). This pays when the answer copies from the prompt: edits, rewrites, code, quotes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    def __init__(self, n_max: int = 4, n_min: int = 2) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_max = n_max
        self.n_min = n_min

    def propose(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier match of the context's suffix."""
        return self.lookup(tokens, k)[0]

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """(proposal, length of the suffix that matched); ((), 0) when nothing matched."""
        if k < 1 or len(tokens) < self.n_min + 1:
            return (), 0
        arr = np.asarray(tokens, dtype=np.int64)  # [L]
        length = arr.shape[0]
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            suffix = arr[length - n :]
            # Windows starting at 0..L-n-1: every earlier place the suffix could occur (the
            # suffix itself, at L-n, is excluded).
            windows = sliding_window_view(arr[: length - 1], n)  # [L-n, n]
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size == 0:
                continue
            start = int(hits[-1]) + n  # the token after the most recent match
            return _continue_from(arr, start, k), n
        return (), 0


def _continue_from(arr: np.ndarray, start: int, k: int) -> tuple[int, ...]:
    """k tokens copied from ``start`` on. When the copy reaches the end of the context it goes
    on from the tokens it has just proposed: the match was ``length - start`` tokens back, so a
    text repeating a period that short (a loop, a table row, a list pattern) is proposed k tokens
    ahead instead of only up to the period."""
    length = arr.shape[0]
    out = [int(t) for t in arr[start : start + k]]
    period = length - start
    while len(out) < k:
        out.append(out[len(out) - period])
    return tuple(out)
