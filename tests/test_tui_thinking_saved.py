"""A thinking answer in a saved conversation: the file keeps the reasoning apart from the
answer, it reopens as a folded block above the answer, and it goes back to the template as
``reasoning_content``, which Qwen3's drops from earlier turns. Real engine and templates, a
model scripted to think then answer (tests/tui_thinking.py)."""

from __future__ import annotations

import json

import pytest

from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.host import ChatHost
from localinfer.tui.settings import ChatSettings
from localinfer.tui.thinking_block import ThinkingBlock
from tests.tui_pilot import SIZE, StepClock
from tests.tui_thinking import ANSWER, THOUGHT, ask, chat_app, qwen3_session


@pytest.fixture(scope="module")
def qwen3():
    session = qwen3_session()
    yield session
    session.close()


async def test_saved_reasoning_reopens_folded_and_is_not_sent_back(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "What is 2+2?")
    saved = json.loads((tmp_path / f"{app.conversation.id}.json").read_text())
    answer = saved["messages"][1]
    assert answer.pop("stats")["completion_tokens"] > 0  # the answer's figures, for exports
    assert answer == {"role": "assistant", "content": ANSWER, "reasoning": THOUGHT}
    assert "reasoning" not in saved["messages"][0]  # a turn without reasoning saves as before

    store = ConversationStore(tmp_path)
    reopened = store.load(app.conversation.id)
    host = ChatHost(ChatSettings(ctx=4096, slots=1, temperature=0.0), session=qwen3)
    again = ChatApp(host, store, conversation=reopened, clock=StepClock())
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        block = again.query_one(ThinkingBlock)
        assert block.text == THOUGHT and not block.expanded
        assert str(block.content) == "▸ Thought (click to show)"
        assert "ctrl+g" in again.screen.active_bindings
        await pilot.click(ThinkingBlock)
        assert block.expanded and str(block.content) == THOUGHT
        await ask(pilot, "And 3+3?")
        assert len(again.query(ThinkingBlock)) == 2
    messages = reopened.prompt_messages()
    assert messages[1]["reasoning_content"] == THOUGHT  # as the template takes it...
    sent = qwen3.runner.prompts[-1]
    assert f"<|im_start|>assistant\n{ANSWER}<|im_end|>" in sent
    assert "The user asks" not in sent  # ...and Qwen3's drops it from an earlier turn


def test_a_file_with_bad_reasoning_is_unreadable(tmp_path) -> None:
    conversation = Conversation(id="c1")
    conversation.add("user", "Hi")
    data = conversation.to_json()
    data["messages"].append({"role": "assistant", "content": "Hello", "reasoning": 7})
    with pytest.raises(ValueError, match="reasoning"):
        Conversation.from_json(data)
