"""Client-side figures of one streaming answer, measured where the tokens arrive.

The worker thread records every StreamEvent's arrival here (so TTFT is exact even though the UI
only repaints a few times a second) and sends a frozen :class:`StatsSnapshot` to the UI. When the
answer ends, the engine's own :class:`RequestMetrics` replace the client-side estimates.
The clock is injectable so tests and snapshots are deterministic.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localinfer.engine.metrics import DecodePace
from localinfer.engine.types import RequestMetrics


@dataclass(slots=True, frozen=True)
class StatsSnapshot:
    running: bool = False
    ttft_s: float | None = None
    current_tps: float | None = None  # over the last `window_s`
    average_tps: float | None = None  # decode rate: tokens after the first / time since the first
    tpot_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    history: tuple[float, ...] = ()  # tokens/s per bucket, oldest first (for the sparkline)
    # A thinking answer's (None: no reasoning came): its reasoning tokens, of
    # ``completion_tokens``, and the time to its first answer token (``ttft_s`` is then the time
    # to its first token, which opens the reasoning).
    reasoning_tokens: int | None = None
    answer_ttft_s: float | None = None

    @property
    def answer_tokens(self) -> int:
        return self.completion_tokens - (self.reasoning_tokens or 0)

    def saved_figures(self) -> dict[str, float]:
        """The figures an answer is saved with (an export quotes them); unmeasured ones left out."""
        figures: dict[str, float | None] = {
            "ttft_s": self.ttft_s,
            "decode_tok_s": self.average_tps,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "answer_ttft_s": self.answer_ttft_s,
        }
        return {k: round(v, 4) for k, v in figures.items() if v is not None}


class LiveStats:
    """Accumulates token arrivals of one request; not thread-safe (one worker owns it)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = 1.0,
        bucket_s: float = 0.25,
        buckets: int = 48,
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._bucket_s = bucket_s
        self._buckets = buckets
        self._t0: float | None = None
        self._first: float | None = None
        self._last: float | None = None
        self._arrivals: deque[tuple[float, int]] = deque()  # (time, tokens), within the window
        self._history: deque[float] = deque(maxlen=buckets)
        self._bucket_start: float | None = None
        self._bucket_tokens = 0
        self._prompt_tokens = 0
        self._completion = 0
        self._final: RequestMetrics | None = None
        self._reasoned = False  # reasoning text came
        self._answer_at: float | None = None  # when the first answer text came
        self._before_answer = 0  # tokens before it (the reasoning's, while it streams)

    def start(self, prompt_tokens: int) -> None:
        self._t0 = self._clock()
        self._prompt_tokens = prompt_tokens

    def add(self, n_tokens: int, *, reasoning: bool = False, answer: bool = False) -> None:
        """``n_tokens`` arrived; ``reasoning``/``answer``: they brought reasoning or answer text
        (a thinking answer's tokens are counted apart: those before its answer are reasoning)."""
        self._reasoned = self._reasoned or reasoning
        first_answer = answer and self._answer_at is None
        if n_tokens <= 0 and not first_answer:
            return
        now = self._clock()
        if first_answer:
            self._answer_at, self._before_answer = now, self._completion
        if n_tokens <= 0:
            return
        if self._first is None:
            self._first = now
            self._bucket_start = now
        self._close_buckets(now)
        self._bucket_tokens += n_tokens
        self._last = now
        self._completion += n_tokens
        self._arrivals.append((now, n_tokens))

    def finish(self, metrics: RequestMetrics | None) -> None:
        self._final = metrics

    def _close_buckets(self, now: float) -> None:
        assert self._bucket_start is not None
        while now - self._bucket_start >= self._bucket_s:
            self._history.append(self._bucket_tokens / self._bucket_s)
            self._bucket_tokens = 0
            self._bucket_start += self._bucket_s

    def snapshot(self) -> StatsSnapshot:
        now = self._clock()
        running = self._final is None and self._t0 is not None
        average = tpot = None
        pace = DecodePace.between(self._first, self._last, self._completion)
        if pace is not None and pace.tokens_per_s is not None:  # tokens over a measurable span
            average, tpot = pace.tokens_per_s, pace.tpot_s
        current = average
        if running and self._first is not None:
            current = self._window_rate(now, self._first)
        snap = StatsSnapshot(
            running=running,
            ttft_s=self._ttft(),
            current_tps=current,
            average_tps=average,
            tpot_s=tpot,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._completion,
            history=tuple(self._history),
            **self._reasoning_figures(),
        )
        final = self._final
        if final is None:
            return snap
        # The engine measured from submit inside its own thread: prefer its figures.
        return StatsSnapshot(
            running=False,
            ttft_s=final.ttft_s if final.ttft_s is not None else snap.ttft_s,
            current_tps=None,  # nothing is streaming any more
            average_tps=final.decode_tps if final.decode_tps is not None else snap.average_tps,
            tpot_s=final.tpot_s if final.tpot_s is not None else snap.tpot_s,
            prompt_tokens=final.prompt_tokens,
            completion_tokens=final.completion_tokens,
            cached_tokens=final.cached_tokens,
            history=snap.history,
            **self._reasoning_figures(final),
        )

    def _reasoning_figures(self, final: RequestMetrics | None = None) -> dict[str, Any]:
        """A thinking answer's split: the engine's count at the end, where it gave one; until
        then every token before the first answer text. The time to the answer is measured here,
        from the first token on top of the engine's TTFT once it gave one (one clock for both)."""
        if not self._reasoned and not (final is not None and final.reasoning_tokens):
            return {}
        count = self._completion if self._answer_at is None else self._before_answer
        if final is not None and final.reasoning_tokens:
            count = final.reasoning_tokens
        answer_ttft = None
        if self._answer_at is not None and self._t0 is not None:
            answer_ttft = self._answer_at - self._t0
            if final is not None and final.ttft_s is not None and self._first is not None:
                answer_ttft = final.ttft_s + (self._answer_at - self._first)
        return {"reasoning_tokens": count, "answer_ttft_s": answer_ttft}

    def _ttft(self) -> float | None:
        return None if self._first is None or self._t0 is None else self._first - self._t0

    def _window_rate(self, now: float, first: float) -> float | None:
        """Tokens per second over (start, now], start = the later of one window ago and the
        first token (the first token itself marks the start, so it is not counted)."""
        start = max(now - self._window_s, first)
        while self._arrivals and self._arrivals[0][0] <= start:
            self._arrivals.popleft()
        span = now - start
        return sum(n for _, n in self._arrivals) / span if span > 0 else None
