"""How far apart the chat shows a streaming answer's text: as often as the UI can afford.

Every text update costs the UI thread a Markdown append and a repaint of the screen, and on a
machine whose cores the engine's threads all use, that CPU comes out of the engine: the thread
that paints takes a core from one of the engine's OpenMP workers, and the whole team waits for it
at the next barrier. So the UI gets a share of one core (``UI_SHARE``) while an answer streams,
and updates are spaced by what they cost here: the UI thread's CPU between two updates (which
holds the repaint the previous one caused) over the share. A fast machine, or a short answer,
still gets ``MAX_UPDATES_PER_SECOND``; a slow terminal or a long answer gets fewer, never fewer
than one each ``MAX_INTERVAL_S``. The pump (a worker thread) reads the interval; the UI thread
records the cost: one float each way, so no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The UI's share of one core while an answer streams. On a 2-core machine running two engine
# threads, what the UI takes costs decode about as much: 4% keeps the chat within 0.95x of the
# engine's own rate (scripts/bench-paths; docs/measurements.md, "One engine speed on every path").
UI_SHARE = 0.04
MAX_UPDATES_PER_SECOND = 20
MAX_INTERVAL_S = 0.5  # the slowest pace: text still shows twice a second
SMOOTHING = 0.3  # weight of the newest cost in the running estimate


class RenderPace:
    """The UI thread's CPU per text update, as a running estimate, and the spacing it allows."""

    def __init__(self, share: float = UI_SHARE, cpu_clock: Callable[[], float] = time.thread_time):
        self._share = share
        self._cpu_clock = cpu_clock
        self._cost = 0.0  # CPU seconds per update; 0 until measured
        self._last: float | None = None

    def start(self) -> None:
        """A new answer: its first update starts the measurement (the estimate carries over, as
        the screen's cost does)."""
        self._last = None

    def updated(self) -> None:
        """Called on the UI thread as it handles each text update."""
        now = self._cpu_clock()
        if self._last is not None:
            spent = now - self._last
            self._cost = (
                spent if self._cost == 0.0 else self._cost + SMOOTHING * (spent - self._cost)
            )
        self._last = now

    def interval(self) -> float:
        """Seconds between two text updates (read by the pump's thread)."""
        wanted = self._cost / self._share
        return min(MAX_INTERVAL_S, max(1.0 / MAX_UPDATES_PER_SECOND, wanted))
