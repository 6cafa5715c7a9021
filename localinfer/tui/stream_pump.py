"""Turns an engine's StreamEvents into a few UI updates a second (runs in a worker thread).

The engine can emit hundreds of events a second; repainting Markdown that often would starve the
UI. The pump records every event's arrival in :class:`LiveStats`, accumulates the text, and emits
an :class:`AnswerProgress` at most once per ``min_interval`` (the first token is emitted at once so
the time to first token shows immediately). Each progress carries the *whole* answer so far, so the
UI may drop any stale progress message in favour of a newer one without losing text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from localinfer.engine.types import EngineMetrics, FinishReason, StreamEvent
from localinfer.tui.live_stats import LiveStats, StatsSnapshot

UPDATES_PER_SECOND = 25


@dataclass(slots=True, frozen=True)
class AnswerProgress:
    request_id: str
    text: str  # the whole answer so far
    stats: StatsSnapshot
    engine: EngineMetrics | None = None
    finish_reason: FinishReason | None = None  # set on the last progress of an answer
    error: str | None = None


def pump_answer(
    request_id: str,
    events: Iterable[StreamEvent],
    stats: LiveStats,
    emit: Callable[[AnswerProgress], None],
    engine_metrics: Callable[[], EngineMetrics] | None = None,
    clock: Callable[[], float] = time.monotonic,
    min_interval: float = 1.0 / UPDATES_PER_SECOND,
) -> AnswerProgress:
    """Drain ``events``; emit throttled progress; return (without emitting) the final progress."""
    parts: list[str] = []
    last_emit = float("-inf")
    finish: FinishReason | None = None
    error: str | None = None
    for event in events:
        parts.append(event.text)
        stats.add(len(event.token_ids))
        if event.finish_reason is not None:
            finish, error = event.finish_reason, event.error
            stats.finish(event.metrics)
            break
        now = clock()
        if now - last_emit >= min_interval and parts:
            last_emit = now
            emit(_progress(request_id, parts, stats, engine_metrics))
    if finish is None:
        # The iterator ended without a final event: the engine went away mid-answer.
        finish, error = "error", error or "the engine stopped before the answer finished"
        stats.finish(None)
    return _progress(request_id, parts, stats, engine_metrics, finish, error)


def _progress(
    request_id: str,
    parts: list[str],
    stats: LiveStats,
    engine_metrics: Callable[[], EngineMetrics] | None,
    finish: FinishReason | None = None,
    error: str | None = None,
) -> AnswerProgress:
    text = "".join(parts)
    # Keep the list short so joining stays cheap on long answers.
    parts[:] = [text]
    engine = engine_metrics() if engine_metrics is not None else None
    return AnswerProgress(request_id, text, stats.snapshot(), engine, finish, error)
