"""Turns an engine's StreamEvents into a few small UI updates a second (runs in a worker thread).

The engine can emit a hundred tokens a second or more; the UI must not pay per token. The pump
records every event's arrival in :class:`LiveStats` and hands the UI two kinds of update, each
throttled on its own: the text that arrived since the last text update (at most
``text_interval`` apart: ~20 a second, appended to the answer as it is), and a stats snapshot
(at most ``stats_interval`` apart: twice a second; while text updates are as far apart, with
one once half due, so that both share one repaint). A text update also waits for
``TOKENS_PER_TEXT_UPDATE`` tokens unless the last one is ``TEXT_MAX_WAIT_S`` old: a render
costs the UI the same for one token as for six, so a slower engine is not charged more UI time
per token, and a slow one still shows its text within a quarter of a second. The first token
goes out at once so the time to first token shows immediately. Nothing here walks the whole
answer per token: pieces are joined once per update, and the whole text once at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from localinfer.engine.types import EngineMetrics, FinishReason, StreamEvent
from localinfer.tui.live_stats import LiveStats, StatsSnapshot

TEXT_UPDATES_PER_SECOND = 20
TOKENS_PER_TEXT_UPDATE = 6
TEXT_MAX_WAIT_S = 0.25
STATS_UPDATES_PER_SECOND = 2


@dataclass(slots=True, frozen=True)
class AnswerEnd:
    """The last word on an answer: its whole text, and the part no text update carried yet."""

    request_id: str
    text: str  # the whole answer
    tail: str  # the end of ``text`` not yet handed to ``StreamSink.text``
    stats: StatsSnapshot
    engine: EngineMetrics | None = None
    finish_reason: FinishReason = "stop"
    error: str | None = None
    reasoning: str = ""  # a thinking model's whole reasoning
    reasoning_tail: str = ""  # the end of ``reasoning`` not yet handed to ``StreamSink``


class StreamSink(Protocol):
    """Where the pump sends its updates (the app posts them as messages to the UI thread)."""

    def text(self, delta: str) -> None: ...

    def reasoning(self, delta: str) -> None: ...

    def stats(self, snapshot: StatsSnapshot, engine: EngineMetrics | None) -> None: ...


@dataclass(slots=True)
class _Throttle:
    interval: float
    min_tokens: int = 0  # also wait for this many tokens...
    max_wait: float = 0.0  # ...unless the last update is this old
    last: float = float("-inf")

    def due(self, now: float, tokens: int = 0, slack: float = 0.0) -> bool:
        """``slack``: count as due this much early (to share a frame with another update)."""
        elapsed = now - self.last
        if elapsed + slack < self.interval:
            return False
        if tokens < self.min_tokens and elapsed < self.max_wait:
            return False
        self.last = now
        return True


def _tokens(event: StreamEvent) -> int:
    """The tokens an event carries. A server's stream names no token ids: each of its text
    chunks counts as one (`localinfer serve` sends a chunk per engine step, one token without
    speculation); the server's exact count replaces the estimate when the answer ends."""
    if event.token_ids:
        return len(event.token_ids)
    return 1 if (event.text or event.reasoning) and event.finish_reason is None else 0


def pump_answer(
    request_id: str,
    events: Iterable[StreamEvent],
    stats: LiveStats,
    sink: StreamSink,
    engine_metrics: Callable[[], EngineMetrics] | None = None,
    clock: Callable[[], float] = time.monotonic,
    text_interval: float = 1.0 / TEXT_UPDATES_PER_SECOND,
    stats_interval: float = 1.0 / STATS_UPDATES_PER_SECOND,
    pace: Callable[[], float] | None = None,
) -> AnswerEnd:
    """Drain ``events`` into throttled updates; return (without sending) the answer's end.
    ``pace``: the text interval now (render_pace.py: what the UI can afford), read before each
    check; None: ``text_interval`` throughout."""
    parts: list[str] = []  # the whole answer, joined once at the end
    pending: list[str] = []  # since the last text update
    thought: list[str] = []  # reasoning since the last update (sent on the text's pace)
    reasoning: list[str] = []  # the whole reasoning
    pending_tokens = 0
    text_due = _Throttle(text_interval, TOKENS_PER_TEXT_UPDATE, TEXT_MAX_WAIT_S)
    stats_due = _Throttle(stats_interval)
    finish: FinishReason | None = None
    error: str | None = None
    for event in events:
        if event.reasoning:
            thought.append(event.reasoning)
            reasoning.append(event.reasoning)
        if event.text:
            parts.append(event.text)
            pending.append(event.text)
        tokens = _tokens(event)
        stats.add(tokens, reasoning=bool(event.reasoning), answer=bool(event.text))
        pending_tokens += tokens
        if event.finish_reason is not None:
            finish, error = event.finish_reason, event.error
            stats.finish(event.metrics)
            break
        now = clock()
        if pace is not None:
            text_due.interval = pace()
        # Reasoning goes out on the text's pace, and at once when the answer starts.
        if thought and (pending or text_due.due(now, pending_tokens)):
            sink.reasoning("".join(thought))
            thought.clear()
            if not pending:
                pending_tokens = 0
        sent_text = bool(pending) and text_due.due(now, pending_tokens)
        if sent_text:
            sink.text("".join(pending))
            pending.clear()
            pending_tokens = 0
        # While text updates are spaced out (the UI at its pace's limit), figures half due go
        # out with the text: one repaint for both, not two.
        slack = stats_due.interval / 2
        if stats_due.due(now, slack=slack if sent_text and text_due.interval >= slack else 0.0):
            sink.stats(stats.snapshot(), engine_metrics() if engine_metrics else None)
    if finish is None:
        # The iterator ended without a final event: the engine went away mid-answer.
        finish, error = "error", error or "the engine stopped before the answer finished"
        stats.finish(None)
    engine = engine_metrics() if engine_metrics is not None else None
    return AnswerEnd(
        request_id, "".join(parts), "".join(pending), stats.snapshot(), engine, finish, error,
        reasoning="".join(reasoning), reasoning_tail="".join(thought),
    )  # fmt: skip
