"""scripts/bench-chat --earlier: finished answers on screen above the measured one, the request
unchanged (the chat's re-layout cost with a long conversation on screen, #23)."""

from __future__ import annotations

import asyncio

from bench.chat import BenchApp, ChatBenchConfig, earlier_answer, run_chat
from localinfer.conversations import ConversationStore
from localinfer.tui.conversation_view import AnswerTurn, UserTurn
from tests.tui_pilot import ScriptedChatSession

SCRIPT = "A short story, told slowly. " * 20


def test_earlier_answers_are_distinct_markdown_of_a_steady_size():
    first, fifth = earlier_answer(0), earlier_answer(4)
    assert first != fifth and first.startswith("## Part 1") and fifth.startswith("## Part 5")
    assert "```python" in first and "\n- step 0" in first
    assert 0.95 < len(fifth) / len(first) < 1.05  # each one the same load on the layout


def test_run_chat_with_earlier_answers_on_screen(tmp_path, monkeypatch):
    scripted = ScriptedChatSession(SCRIPT)
    seen: dict[str, int] = {}
    finish = BenchApp._finish_answer

    def count_turns(app) -> None:
        seen["answers"] = len(app.view.query(AnswerTurn))
        seen["users"] = len(app.view.query(UserTurn))
        finish(app)

    monkeypatch.setattr(BenchApp, "_finish_answer", count_turns)
    config = ChatBenchConfig(max_tokens=200, window=10, keys=0, earlier=3)
    try:
        run = asyncio.run(run_chat(scripted, config, ConversationStore(tmp_path)))
    finally:
        scripted.close()
    assert run.text == SCRIPT  # the measured answer, checked against the screen by run_chat
    assert seen == {"answers": 4, "users": 4}  # three earlier turns and the measured one
