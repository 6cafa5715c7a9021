"""Live figures while an answer streams: TTFT, tokens/s (+ sparkline), TPOT, tokens, engine load;
a thinking answer's reasoning and answer apart."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from localinfer.engine.types import EngineMetrics
from localinfer.tui.live_stats import StatsSnapshot

DASH = "—"


def _seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _rate(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f} tok/s"


def format_answer_stats(snap: StatsSnapshot) -> str:
    cached = f" ({snap.cached_tokens} cached)" if snap.cached_tokens else ""
    if snap.reasoning_tokens is not None:
        return _thinking_answer_stats(snap, cached)
    return "\n".join(
        [
            f"TTFT       {_seconds(snap.ttft_s)}",
            f"now        {_rate(snap.current_tps)}",
            f"average    {_rate(snap.average_tps)}",
            f"TPOT       {_seconds(snap.tpot_s)}",
            f"prompt     {snap.prompt_tokens} tok{cached}",
            f"completion {snap.completion_tokens} tok",
        ]
    )


def _thinking_answer_stats(snap: StatsSnapshot, cached: str) -> str:
    """A thinking answer's figures: the time to its first token (which opens the reasoning) and
    to its first answer token, and its reasoning and answer tokens apart."""
    return "\n".join(
        [
            f"TTFT think  {_seconds(snap.ttft_s)}",
            f"TTFT answer {_seconds(snap.answer_ttft_s)}",
            f"now         {_rate(snap.current_tps)}",
            f"average     {_rate(snap.average_tps)}",
            f"TPOT        {_seconds(snap.tpot_s)}",
            f"prompt      {snap.prompt_tokens} tok{cached}",
            f"reasoning   {snap.reasoning_tokens} tok",
            f"answer      {snap.answer_tokens} tok",
        ]
    )


def format_engine_stats(m: EngineMetrics | None) -> str:
    if m is None:
        return f"slots      {DASH}\nqueue      {DASH}\nKV cells   {DASH}"
    lines = [
        f"slots      {m.slots_busy}/{m.slots_total} busy",
        f"queue      {m.queue_depth}",
        f"KV cells   {m.kv_cells_used}/{m.kv_cells_total}",
    ]
    if m.spec_proposed:
        rate = m.spec_accepted / m.spec_proposed
        lines.append(f"spec acc   {rate:.0%} ({m.spec_accepted}/{m.spec_proposed})")
    return "\n".join(lines)


class StatsPanel(Vertical):
    """Updated a few times a second while an answer streams (the stream pump's stats rate).

    The figures keep their number of lines, so an update repaints the panel alone: a layout pass
    would place every widget on the screen again, the whole conversation included.
    """

    DEFAULT_CSS = """
    StatsPanel { height: auto; }
    StatsPanel Sparkline { height: 2; margin: 0 0 1 0; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.renders = 0  # updates of the figures (tests and scripts/bench-chat read it)

    def compose(self) -> ComposeResult:
        yield Static(format_answer_stats(StatsSnapshot()), id="answer-stats", markup=False)
        yield Sparkline([], id="tps-sparkline")
        yield Static(format_engine_stats(None), id="engine-stats", markup=False)

    def show_answer(self, snap: StatsSnapshot) -> None:
        self.renders += 1
        _update_lines(self.query_one("#answer-stats", Static), format_answer_stats(snap))
        self.query_one("#tps-sparkline", Sparkline).data = list(snap.history)

    def show_engine(self, metrics: EngineMetrics | None) -> None:
        _update_lines(self.query_one("#engine-stats", Static), format_engine_stats(metrics))

    @property
    def answer_text(self) -> str:
        return str(self.query_one("#answer-stats", Static).content)


def _update_lines(widget: Static, text: str) -> None:
    """Show ``text``; lay out again only when its number of lines changed."""
    before = str(widget.content)
    if text == before:
        return
    widget.update(text, layout=text.count("\n") != before.count("\n"))
