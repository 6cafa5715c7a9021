"""Hold a live engine between two forwards, so that a request stays in flight for as long as a test
needs it on a machine of any speed.

A long answer alone (``max_tokens`` in the hundreds) only makes it likely that a request is still
running when the test looks: on a fast machine, or with the client's thread starved of its core, the
engine finishes first and the test fails. Here the test, not the machine, decides how far the
engine got.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from localinfer.engine import Engine

# A gate the test forgot to open must not hang the suite: the engine goes on after this long.
HOLD_LIMIT_S = 120.0


class EngineGate:
    """Lets ``free`` more forwards through, then holds the engine thread before each next one
    until the test lets it go on: ``advance`` by a number of forwards, or ``open`` for good."""

    def __init__(self, engine: Engine, free: int) -> None:
        self._runner = engine.runner
        self._forward = self._runner.forward
        self._allowed = free
        self._opened = False
        self._holds = 0  # times the engine has stopped at the gate
        self._changed = threading.Condition()
        # An instance attribute shadows the runner's method until ``open`` deletes it.
        self._runner.forward = self._gated  # type: ignore[method-assign]

    def _gated(self, batch: Sequence[Any]) -> Any:
        with self._changed:
            if not self._allowed and not self._opened:
                self._holds += 1
                self._changed.notify_all()
                self._changed.wait_for(lambda: self._allowed or self._opened, HOLD_LIMIT_S)
            self._allowed = max(0, self._allowed - 1)
        return self._forward(batch)

    def wait_held(self, holds: int = 1, timeout: float = 120.0) -> None:
        """Until the engine has stopped at the gate ``holds`` times in all."""
        with self._changed:
            reached = self._changed.wait_for(lambda: self._holds >= holds, timeout)
        assert reached, f"the engine did not reach the gate in {timeout:.0f} s"

    def advance(self, forwards: int = 1) -> None:
        """Let ``forwards`` more forwards through and wait until the engine is held again (it
        must still have work: a step that forwards nothing never reaches the gate)."""
        with self._changed:
            holds = self._holds
            self._allowed += forwards
            self._changed.notify_all()
        self.wait_held(holds + 1)

    def open(self) -> None:
        """Let the engine run freely again; the runner's own method is back."""
        with self._changed:
            if self._opened:
                return
            self._opened = True
            self._changed.notify_all()
        del self._runner.forward


@contextmanager
def engine_held(engine: Engine, free: int) -> Iterator[EngineGate]:
    """An EngineGate that is open again when the block ends, however it ends."""
    gate = EngineGate(engine, free)
    try:
        yield gate
    finally:
        gate.open()
