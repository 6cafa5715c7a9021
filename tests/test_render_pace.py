"""The chat's text updates are spaced by what they cost the UI thread (tui/render_pace.py), and
the stream pump follows the pace it is given. Given clocks only: nothing here times the machine."""

from __future__ import annotations

import pytest

from localinfer.engine.types import StreamEvent
from localinfer.tui.live_stats import LiveStats
from localinfer.tui.render_pace import MAX_INTERVAL_S, MAX_UPDATES_PER_SECOND, RenderPace
from localinfer.tui.stream_pump import pump_answer


class GivenClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def paced(costs: list[float], share: float = 0.04) -> RenderPace:
    """A pace that saw updates costing ``costs`` CPU seconds each on the UI thread."""
    cpu = GivenClock()
    pace = RenderPace(share, cpu_clock=cpu)
    pace.start()
    pace.updated()
    for cost in costs:
        cpu.now += cost
        pace.updated()
    return pace


def test_cheap_updates_go_at_the_full_rate() -> None:
    assert RenderPace().interval() == pytest.approx(1 / MAX_UPDATES_PER_SECOND)  # unmeasured
    assert paced([0.001] * 5).interval() == pytest.approx(1 / MAX_UPDATES_PER_SECOND)


def test_costly_updates_are_spaced_to_the_share() -> None:
    # 6 ms a render at a 4% share: one update each 150 ms (the UI's CPU stays at 4% of a core).
    assert paced([0.006] * 3).interval() == pytest.approx(0.15)
    # A render dearer than the slowest pace allows still shows text at the slowest pace.
    assert paced([0.05] * 3).interval() == MAX_INTERVAL_S


def test_the_estimate_follows_a_changing_cost_smoothly() -> None:
    pace = paced([0.002] * 5 + [0.008])
    assert 0.002 / 0.04 < pace.interval() < 0.008 / 0.04  # one dear render moves it part way
    pace = paced([0.002] * 5 + [0.008] * 30)
    assert pace.interval() == pytest.approx(0.2, rel=1e-3)  # a lasting one, all the way


def test_a_new_answer_does_not_count_the_idle_time_before_it() -> None:
    cpu = GivenClock()
    pace = RenderPace(0.04, cpu_clock=cpu)
    pace.updated()
    cpu.now += 0.002
    pace.updated()
    cpu.now += 5.0  # between answers: typing, scrolling, other screens
    pace.start()
    pace.updated()
    assert pace.interval() == pytest.approx(0.05)


class Sink:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def text(self, delta: str) -> None:
        self.texts.append(delta)

    def stats(self, snapshot: object, engine: object) -> None:
        pass


def test_the_pump_sends_text_at_the_pace_it_is_given() -> None:
    """100 tokens, 10 ms apart on the pump's clock: a 0.2 s pace gives about 5 updates where
    the full rate (0.05 s, and at least 6 tokens) about 17."""

    def run(pace: float) -> int:
        clock = GivenClock()

        def events():
            for i in range(100):
                clock.now += 0.01
                yield StreamEvent("r", f"t{i} ", (i,))
            yield StreamEvent("r", "", (), finish_reason="length")

        sink = Sink()
        end = pump_answer("r", events(), LiveStats(clock=clock), sink, clock=clock,
                          pace=lambda: pace)  # fmt: skip
        assert "".join(sink.texts) + end.tail == "".join(f"t{i} " for i in range(100))
        return len(sink.texts)

    slow, fast = run(0.2), run(0.05)
    assert 4 <= slow <= 6 and 15 <= fast <= 20  # (the full rate also waits for 6 tokens)


def test_figures_share_the_repaint_of_slow_text_updates() -> None:
    """At a 0.35 s text pace (the UI near its limit), each stats update goes out with a text
    update, not some time after it in a repaint of its own; at the full rate they do not."""

    def run(pace: float) -> tuple[list[float], list[float]]:
        clock = GivenClock()
        sent: dict[str, list[float]] = {"text": [], "stats": []}

        class TimedSink:
            def text(self, delta: str) -> None:
                sent["text"].append(clock.now)

            def stats(self, snapshot: object, engine: object) -> None:
                sent["stats"].append(clock.now)

        def events():
            for i in range(400):
                clock.now += 0.01
                yield StreamEvent(request_id="r", text=f"w{i} ", token_ids=(i,))

        pump_answer("r", events(), LiveStats(clock=clock), TimedSink(), None, clock,
                    stats_interval=0.5, pace=lambda: pace)  # fmt: skip
        return sent["text"], sent["stats"]

    texts, stats = run(0.35)
    assert len(stats) >= 7 and all(t in texts for t in stats[1:])
    texts, stats = run(0.05)
    assert len(stats) <= 4.0 / 0.5 + 1  # never more often than the figures' own rate
