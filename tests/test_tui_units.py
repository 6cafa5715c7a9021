"""The chat's non-UI parts: live stats, the stream pump, prompt history, settings parsing."""

from __future__ import annotations

import dataclasses

import pytest

from localinfer.engine.types import EngineMetrics, RequestMetrics, StreamEvent
from localinfer.tui.live_stats import LiveStats
from localinfer.tui.prompt_history import PromptHistory
from localinfer.tui.settings import ChatSettings
from localinfer.tui.settings_screen import SettingsError, parse_settings
from localinfer.tui.stream_pump import TEXT_MAX_WAIT_S, TOKENS_PER_TEXT_UPDATE, pump_answer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_live_stats_ttft_rates_and_tpot():
    clock = FakeClock()
    stats = LiveStats(clock=clock, window_s=1.0, bucket_s=0.5)
    stats.start(prompt_tokens=12)
    clock.advance(0.2)
    stats.add(1)  # first token: TTFT 0.2 s
    for _ in range(20):  # then 10 tok/s for 2 s
        clock.advance(0.1)
        stats.add(1)
    clock.advance(0.05)  # keep arrivals off the window's edge
    snap = stats.snapshot()
    assert snap.running
    assert snap.ttft_s == pytest.approx(0.2)
    assert snap.average_tps == pytest.approx(10.0)
    assert snap.tpot_s == pytest.approx(0.1)
    assert snap.current_tps == pytest.approx(10.0)
    assert snap.completion_tokens == 21 and snap.prompt_tokens == 12
    assert len(snap.history) >= 3 and all(v == pytest.approx(10.0) for v in snap.history[1:3])
    clock.advance(2.0)  # a stall: the current rate drops, the average does not
    assert stats.snapshot().current_tps == 0.0


def test_live_stats_prefers_engine_metrics_at_the_end():
    clock = FakeClock()
    stats = LiveStats(clock=clock)
    stats.start(5)
    clock.advance(0.5)
    stats.add(3)
    stats.finish(RequestMetrics(5, 3, cached_tokens=2, ttft_s=0.25, tpot_s=0.02, decode_tps=50.0))
    snap = stats.snapshot()
    assert not snap.running
    assert (snap.ttft_s, snap.tpot_s, snap.average_tps) == (0.25, 0.02, 50.0)
    assert snap.cached_tokens == 2


def _events(texts, finish="stop"):
    out = [StreamEvent("r1", t, (i,)) for i, t in enumerate(texts)]
    out.append(StreamEvent("r1", "", (), finish_reason=finish, metrics=RequestMetrics(3, 4)))
    return out


class RecordingSink:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.snapshots: list[object] = []

    def text(self, delta: str) -> None:
        self.texts.append(delta)

    def stats(self, snapshot, engine) -> None:
        self.snapshots.append((snapshot, engine))


def test_pump_sends_the_text_since_the_last_update_and_loses_none():
    clock = FakeClock()
    sink = RecordingSink()
    pieces = [f"w{i} " for i in range(200)]

    def events():
        for ev in _events(pieces):
            clock.advance(0.01)  # 100 tokens/s: five per text update at 20 a second
            yield ev

    metrics = EngineMetrics(1, 1, 0, 10, 100, 0, 0, 0)
    start = clock.now
    end = pump_answer(
        "r1", events(), LiveStats(clock=clock), sink, lambda: metrics, clock, 0.05, 0.25
    )
    elapsed = clock.now - start
    whole = "".join(pieces)
    assert end.text == whole and end.finish_reason == "stop" and end.engine == metrics
    # Every piece exactly once: the updates, then the tail the end carries.
    assert "".join(sink.texts) + end.tail == whole
    assert sink.texts[0] == "w0 "  # the first token shows at once
    # Coalesced: at most one text update per interval (+ the first), stats far fewer.
    assert len(sink.texts) <= elapsed / 0.05 + 1 and len(sink.texts) < len(pieces) / 4
    # Each update after the first carries at least TOKENS_PER_TEXT_UPDATE tokens (one a piece).
    assert all(t.count(" ") >= TOKENS_PER_TEXT_UPDATE for t in sink.texts[1:])
    assert 1 <= len(sink.snapshots) <= elapsed / 0.25 + 1


def test_pump_sends_each_slow_token_at_once():
    clock = FakeClock()
    sink = RecordingSink()

    def events():
        for ev in _events(["a", "b", "c"]):
            clock.advance(TEXT_MAX_WAIT_S + 0.05)  # slower than a token may wait: none merged
            yield ev

    end = pump_answer("r1", events(), LiveStats(clock=clock), sink, clock=clock)
    assert sink.texts == ["a", "b", "c"] and end.tail == ""


def test_pump_lets_a_few_tokens_wait_for_company_but_not_long():
    clock = FakeClock()
    sink = RecordingSink()

    def events():
        for ev in _events(["a", "b", "c", "d", "e", "f"]):
            clock.advance(0.1)  # 10 tokens/s: past the update interval, short of 4 tokens
            yield ev

    end = pump_answer("r1", events(), LiveStats(clock=clock), sink, clock=clock)
    # "a" at once; then an update once the last one is TEXT_MAX_WAIT_S old (4 tokens: sooner).
    assert sink.texts == ["a", "bcd"] and end.tail == "ef"


def test_pump_reports_a_stream_that_ends_without_finish():
    stream = [StreamEvent("r1", "partial", (1,))]
    end = pump_answer("r1", stream, LiveStats(), RecordingSink())
    assert end.finish_reason == "error" and end.text == "partial" and end.error


def test_prompt_history_walks_and_restores_the_draft():
    history = PromptHistory()
    history.push("one")
    history.push("two")
    history.push("two")  # repeated entries are stored once
    assert history.previous("draft") == "two"
    assert history.previous("ignored") == "one"
    assert history.previous("ignored") is None
    assert history.next() == "two"
    assert history.next() == "draft"
    assert history.next() is None


def test_settings_reload_and_parse():
    base = ChatSettings()
    form = {
        "temperature": "0.2",
        "top_p": "0.9",
        "max_tokens": "64",
        "ctx": str(base.ctx),
        "slots": str(base.slots),
        "quant": "file",
        "backend": "auto",
        "speculative": "off",
        "draft": "",
    }
    parsed = parse_settings(base, form)
    assert parsed.temperature == 0.2 and parsed.max_tokens == 64
    assert not base.reload_needed(parsed)
    assert parsed.sampling_params().max_tokens == 64
    assert base.reload_needed(parse_settings(base, {**form, "ctx": "1024"}))
    with pytest.raises(SettingsError, match="temperature"):
        parse_settings(base, {**form, "temperature": "hot"})
    with pytest.raises(SettingsError, match="draft"):
        parse_settings(base, {**form, "speculative": "draft"})


def test_memory_render_shows_both_figures_and_the_free_share():
    from localinfer.tui.host import MemoryFigures, MemoryParts
    from localinfer.tui.memory_bar import human_bytes, render_memory

    mib = 2**20
    figures = MemoryFigures(
        predicted=MemoryParts(100 * mib, 50 * mib, 50 * mib),
        measured=MemoryParts(100 * mib, 50 * mib, 0),
        available=1000 * mib,
        device="cpu",
    )
    text = render_memory(figures, width=20).plain
    lines = text.splitlines()
    assert lines[0].startswith("budget") and "200.0 MiB" in lines[0]
    assert lines[1].startswith("measured") and "150.0 MiB" in lines[1]
    # One scale for both bars: the measured one is 3/4 as long as the budget's.
    assert lines[0].count("█") == 20 and lines[1].count("█") == 15
    assert "15%" in text and "850.0 MiB" in text  # share of the machine, and what is left
    assert "unavailable" in render_memory(MemoryFigures()).plain
    assert "reserved" not in text  # nothing said about it: no line
    assert human_bytes(3 * 2**30) == "3.0 GiB"


def test_memory_render_keeps_reserved_memory_out_of_the_used():
    from localinfer.tui.host import MemoryFigures, MemoryParts
    from localinfer.tui.memory_bar import render_memory

    mib = 2**20
    figures = MemoryFigures(
        predicted=MemoryParts(92 * mib, 45 * mib, 65 * mib),
        measured=MemoryParts(92 * mib, 45 * mib, 62 * mib),
        available=1000 * mib,
        device="cpu",
        reserved=103 * mib,
    )
    lines = render_memory(figures, width=20).plain.splitlines()
    measured = next(line for line in lines if line.startswith("measured"))
    assert measured.endswith("199.0 MiB")  # 92 + 45 + 62: the reserved 103 MiB are not in it
    reserved = next(line for line in lines if "reserved" in line)
    assert reserved.split()[-2:] == ["103.0", "MiB"]
    assert any("not all written" in line for line in lines)
    unmeasured = render_memory(dataclasses.replace(figures, measured=None)).plain
    assert "unavailable" in unmeasured and "103.0 MiB" in unmeasured


def test_stats_text_and_speculation_line():
    from localinfer.tui.live_stats import StatsSnapshot
    from localinfer.tui.stats_panel import format_answer_stats, format_engine_stats

    snap = StatsSnapshot(ttft_s=0.125, average_tps=42.0, tpot_s=0.024, completion_tokens=9)
    text = format_answer_stats(snap)
    assert "TTFT       125 ms" in text and "average    42.0 tok/s" in text
    metrics = EngineMetrics(4, 2, 1, 300, 8192, 0, 0, 0, spec_proposed=10, spec_accepted=7)
    engine = format_engine_stats(metrics)
    assert "2/4 busy" in engine and "300/8192" in engine and "spec acc   70% (7/10)" in engine
    assert "spec" not in format_engine_stats(EngineMetrics(1, 0, 0, 0, 10, 0, 0, 0))
