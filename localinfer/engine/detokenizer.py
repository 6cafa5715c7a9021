"""Incremental detokenization for streaming: UTF-8 safe and stop-string aware.

Tokens are turned into text from their raw bytes (``Tokenizer.token_bytes``), not by decoding
each token alone: a multi-byte character (emoji, CJK) is often split over two or three tokens, and
decoding the pieces separately yields U+FFFD garbage. An incremental UTF-8 decoder holds an
incomplete trailing sequence until the next token completes it.

Stop strings: text that could still turn out to be the start of a stop string is held back, so a
client never sees a partial stop string; when a stop string completes, the text before it is
released and the stop string itself (and anything after it) is dropped.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localinfer.loading.unicode_text import scrub_surrogates


@dataclass(slots=True, frozen=True)
class DetokenizerStep:
    text: str  # safe to show now
    stopped: bool = False  # a stop string completed; nothing more will be emitted


class Detokenizer:
    """Turns a stream of token ids into a stream of safe text deltas for one request."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        # Decoded text never holds a lone surrogate (invalid bytes become U+FFFD), so a stop
        # string is compared in the same form: "\udcff" stops where the model wrote U+FFFD.
        self._stop = tuple(scrub_surrogates(s) for s in stop)
        self._stop_given = tuple(stop)
        self.matched_stop: str | None = None  # the stop string (as given) that ended the text
        # errors="replace": genuinely invalid bytes become U+FFFD instead of stalling the stream;
        # only an incomplete sequence at the end is held.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet emitted (could be the start of a stop string)
        self._stopped = False
        self.text = ""  # everything emitted so far

    @property
    def stopped(self) -> bool:
        return self._stopped

    def add(self, token_id: int) -> DetokenizerStep:
        """Feed one token; returns the text that may be shown now."""
        if self._stopped:
            return DetokenizerStep("", stopped=True)
        return self._push(self._utf8.decode(self._token_bytes(token_id)))

    def finish(self) -> str:
        """End of stream (not by a stop string): release held text and any dangling bytes."""
        if self._stopped:
            return ""
        tail = self._held + self._utf8.decode(b"", final=True)
        self._held = ""
        self._stopped = True
        self.text += tail
        return tail

    def _push(self, new: str) -> DetokenizerStep:
        pending = self._held + new
        if not self._stop:
            self.text += pending
            self._held = ""
            return DetokenizerStep(pending)
        # Any stop string lies inside `pending`: emitted text never ends in a stop-string prefix.
        found = self._earliest_stop(pending)
        if found is not None:
            cut, which = found
            self.matched_stop = self._stop_given[which]
            out = pending[:cut]
            self._held = ""
            self._stopped = True
            self.text += out
            return DetokenizerStep(out, stopped=True)
        hold = self._longest_stop_prefix_suffix(pending)
        out = pending[: len(pending) - hold]
        self._held = pending[len(pending) - hold :]
        self.text += out
        return DetokenizerStep(out)

    def _earliest_stop(self, text: str) -> tuple[int, int] | None:
        """Where the first stop string in ``text`` starts, and which one it is."""
        best: tuple[int, int] | None = None
        for which, s in enumerate(self._stop):
            i = text.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, which)
        return best

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest
