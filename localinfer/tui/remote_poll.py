"""The server's engine figures, read in a thread of their own while answers stream.

The stream pump asks for engine figures between tokens and once more at the end; asking the
server there would hold every token behind a ``/metrics`` round trip (two seconds of timeout
when the server is slow). :class:`MetricsPoller` keeps the latest snapshot instead: its thread
reads ``/metrics`` when an answer starts, every ``interval_s`` while answers stream, and once
after the last one ends; ``latest`` only reads a field. A slow or failing ``/metrics`` delays
the figures, never the text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from localinfer.engine.types import EngineMetrics

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5  # the pump shows engine figures twice a second (STATS_UPDATES_PER_SECOND)


class MetricsPoller:
    """``fetch`` (blocking, with its own timeout; None when the server does not say, raising
    when the read failed) run off the answer path. ``begin``/``end`` bracket each answer;
    ``close`` stops the thread."""

    def __init__(
        self,
        fetch: Callable[[], EngineMetrics | None],
        interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self._fetch = fetch
        self._interval_s = interval_s
        self._cond = threading.Condition()
        self._latest: EngineMetrics | None = None
        self._issued = 0  # reads started, numbered: a slow one never overwrites a newer one
        self._kept = 0  # the number of the read ``_latest`` came from
        self._answers = 0  # streaming now
        self._due = False  # read once more without waiting for the interval
        self._closed = False
        self._thread: threading.Thread | None = None

    def latest(self) -> EngineMetrics | None:
        """The figures of the newest read that answered (None before the first, or when the
        server said it has none). A failed read keeps what the panel shows: a blip of the
        network must not blank it."""
        with self._cond:
            return self._latest

    def poll_now(self) -> EngineMetrics | None:
        """Read the figures in the calling thread (attaching: a worker); what ``latest`` says
        after it."""
        self._read()
        return self.latest()

    def begin(self) -> None:
        """An answer starts streaming: read now, then every interval until the last one ends."""
        with self._cond:
            self._answers += 1
            self._due = True
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="localinfer-remote-metrics", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def end(self) -> None:
        """An answer ended: one more read shows the server after it."""
        with self._cond:
            self._answers = max(0, self._answers - 1)
            self._due = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop polling; a read in flight ends by its own timeout (the thread is a daemon)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._due or self._answers > 0)
                if self._closed:
                    return
                self._due = False
            self._read()
            with self._cond:
                # Pace the reads while answers stream; a begin or end reads again at once.
                self._cond.wait_for(lambda: self._closed or self._due, self._interval_s)

    def _read(self) -> None:
        """One read, kept unless it failed or a read started after it was kept first (the poll
        thread and ``poll_now`` may overlap)."""
        with self._cond:
            self._issued += 1
            number = self._issued
        try:
            figures = self._fetch()
        except Exception:  # noqa: BLE001 - a side panel's failure must never stop the poller
            log.debug("reading the server's /metrics failed", exc_info=True)
            return
        with self._cond:
            if number > self._kept:
                self._latest, self._kept = figures, number
