"""N-gram lookup ("prompt lookup decoding"): no model, just the tokens seen so far.

The last n tokens are searched for earlier in the prompt + output; the tokens that followed the
most recent earlier occurrence are the proposal. Longer suffixes are tried first (they predict
better). This pays when the answer copies from the prompt: edits, rewrites, code, quotes.

Lookups run every decode step of every speculating slot, so they must cost next to nothing
beside a few-millisecond forward: each slot keeps an :class:`NgramIndex`, a table from every
n-gram of its context to where it last occurred, extended by the new tokens at each step (a few
dictionary writes per token) instead of a scan of the whole context per step (a numpy scan cost
~0.17 ms a step, 3% of a 5.8 ms decode step on the CPU default engine).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Where each n-gram (n_min <= n <= n_max) of one growing context last occurred with at least
    one token after it."""

    def __init__(self, n_max: int = 4, n_min: int = 2) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_max = n_max
        self.n_min = n_min
        self._tokens: list[int] = []
        # n -> {n-gram: start of its latest occurrence that has a next token}
        self._starts: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(n_min, n_max + 1)
        }

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the index describe ``tokens``: extended by its new tail when ``tokens`` continues
        what was indexed (the usual case: a slot's context only grows), else rebuilt."""
        have = len(self._tokens)
        if have > len(tokens) or (
            have and (tokens[0] != self._tokens[0] or tokens[have - 1] != self._tokens[-1])
        ):
            self._tokens.clear()
            for table in self._starts.values():
                table.clear()
            have = 0
        known = self._tokens
        for pos in range(have, len(tokens)):
            # Token `pos` arrives: every n-gram ending just before it now has a next token.
            for n, table in self._starts.items():
                if pos >= n:
                    table[tuple(known[pos - n : pos])] = pos - n
            known.append(int(tokens[pos]))

    def lookup(self, k: int) -> tuple[tuple[int, ...], int]:
        """(up to k proposed tokens, length of the suffix that matched); ((), 0) if none did."""
        known = self._tokens
        length = len(known)
        if k < 1 or length < self.n_min + 1:
            return (), 0
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            start = self._starts[n].get(tuple(known[length - n :]))
            if start is not None:
                return _continue_from(known, start + n, k), n
        return (), 0


class NgramProposer:
    """Stateless lookups over a whole context (the Speculator keeps one NgramIndex per slot)."""

    def __init__(self, n_max: int = 4, n_min: int = 2) -> None:
        NgramIndex(n_max, n_min)  # validates
        self.n_max = n_max
        self.n_min = n_min

    def index(self) -> NgramIndex:
        return NgramIndex(self.n_max, self.n_min)

    def propose(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier match of the context's suffix."""
        return self.lookup(tokens, k)[0]

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """(proposal, length of the suffix that matched); ((), 0) when nothing matched."""
        index = self.index()
        index.sync(tokens)
        return index.lookup(k)


def _continue_from(tokens: list[int], start: int, k: int) -> tuple[int, ...]:
    """k tokens copied from ``start`` on. When the copy reaches the end of the context it goes
    on from the tokens it has just proposed: the match was ``length - start`` tokens back, so a
    text repeating a period that short (a loop, a table row, a list pattern) is proposed k tokens
    ahead instead of only up to the period."""
    out = tokens[start : start + k]
    period = len(tokens) - start
    while len(out) < k:
        out.append(out[len(out) - period])
    return tuple(out)
