"""A thinking answer's figures in the chat's stats panel: reasoning and answer tokens apart (the
engine's counts), the time to the first token, which opens the reasoning, and to the first
answer token; an answer without reasoning keeps the usual figures. Real engine and Qwen3's
template over a model scripted to think then answer (tests/tui_thinking.py)."""

from __future__ import annotations

import pytest

from localinfer.engine.types import Request, RequestMetrics, SamplingParams
from localinfer.tui.host import ChatHost
from localinfer.tui.live_stats import LiveStats
from localinfer.tui.settings import ChatSettings
from localinfer.tui.stats_panel import StatsPanel, format_answer_stats
from localinfer.tui.thinking_block import ThinkingBlock
from tests.tui_pilot import SIZE
from tests.tui_thinking import ANSWER, THOUGHT, ask, chat_app, qwen3_session


@pytest.fixture(scope="module")
def qwen3():
    session = qwen3_session()
    yield session
    session.close()


def figures(text: str) -> dict[str, str]:
    """The stats panel's lines as {label: value}."""
    return {line[:11].strip(): line[11:].strip() for line in text.splitlines()}


def seconds(value: str) -> float:
    number, unit = value.split()
    return float(number) / 1000 if unit == "ms" else float(number)


async def test_stats_count_reasoning_and_answer_apart(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is 2+2?")
        shown = figures(app.query_one(StatsPanel).answer_text)
        summary = app.query_one(ThinkingBlock).summary
    # The engine's own count for the same prompt, asked directly.
    prompt = ChatHost(ChatSettings(), session=qwen3).prepare(app.conversation.prompt_messages()[:1])
    done = qwen3.engine.submit(
        Request(
            prompt.prompt_ids,
            SamplingParams(max_tokens=500, temperature=0.0),
            reasoning=prompt.reasoning,
        )  # fmt: skip
    ).result()
    metrics = done.metrics
    assert done.reasoning == THOUGHT and done.text == ANSWER
    assert shown["reasoning"] == f"{metrics.reasoning_tokens} tok"
    answer_tokens = metrics.completion_tokens - metrics.reasoning_tokens
    assert shown["answer"] == f"{answer_tokens} tok" and answer_tokens > 0
    assert "completion" not in shown
    assert seconds(shown["TTFT answer"]) > seconds(shown["TTFT think"]) > 0
    assert summary.endswith(f", {metrics.reasoning_tokens} tokens (click to show)")  # folded


async def test_an_answer_without_reasoning_keeps_the_usual_figures(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path, thinking=False)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is 2+2?")
        shown = figures(app.query_one(StatsPanel).answer_text)
    assert set(shown) == {"TTFT", "now", "average", "TPOT", "prompt", "completion"}


def test_live_figures_split_at_the_first_answer_token() -> None:
    now = [10.0]
    stats = LiveStats(clock=lambda: now[0])
    stats.start(prompt_tokens=5)
    for at, reasoning, answer in [(10.5, False, False), (11.0, True, False), (11.5, True, False)]:
        now[0] = at
        stats.add(1, reasoning=reasoning, answer=answer)
    live = stats.snapshot()
    assert (live.reasoning_tokens, live.answer_tokens, live.answer_ttft_s) == (3, 0, None)
    assert live.ttft_s == pytest.approx(0.5)
    now[0] = 13.0
    stats.add(1, answer=True)
    stats.add(2, answer=True)
    live = stats.snapshot()
    assert (live.reasoning_tokens, live.answer_tokens) == (3, 3)
    assert live.answer_ttft_s == pytest.approx(3.0)
    # The engine's figures at the end: its count, and its TTFT with the gap measured here.
    stats.finish(RequestMetrics(5, 6, ttft_s=0.25, reasoning_tokens=2))
    end = stats.snapshot()
    assert (end.reasoning_tokens, end.answer_tokens) == (2, 4)
    assert end.ttft_s == 0.25 and end.answer_ttft_s == pytest.approx(0.25 + 2.5)
    text = format_answer_stats(end)
    assert "TTFT think  250 ms" in text and "TTFT answer 2.75 s" in text
    assert "reasoning   2 tok" in text and "answer      4 tok" in text


def test_no_reasoning_no_split() -> None:
    now = [0.0]
    stats = LiveStats(clock=lambda: now[0])
    stats.start(3)
    now[0] = 1.0
    stats.add(2, answer=True)
    snap = stats.snapshot()
    assert snap.reasoning_tokens is None and snap.answer_ttft_s is None
    assert "completion 2 tok" in format_answer_stats(snap)
