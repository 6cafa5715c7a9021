"""A light progress indicator for model loads: a spinner and the seconds elapsed.

It repaints 6 times a second, not at the frame rate: on a small CPU an animated bar at 60 fps
measurably slowed the load it was waiting for (the worker thread shares the GIL with the UI).
"""

from __future__ import annotations

import time

from textual.timer import Timer
from textual.widgets import Static

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class LoadSpinner(Static):
    DEFAULT_CSS = """
    LoadSpinner { width: auto; color: $accent; display: none; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self._timer: Timer | None = None
        self._frame = 0
        self._started = 0.0

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        if self._timer is None:
            self._started = time.monotonic()
            self._frame = 0
            self._timer = self.set_interval(1 / 6, self._tick)
        self.display = True
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.display = False

    def _tick(self) -> None:
        self._frame = (self._frame + 1) % len(FRAMES)
        self.update(f"{FRAMES[self._frame]} {time.monotonic() - self._started:.0f}s")
