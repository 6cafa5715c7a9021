"""A thinking model in the real chat app, headless: its reasoning streams into a dimmed block
above the answer, which folds to one line when the answer starts and opens again on a click;
the answer widget and the saved message hold the answer alone. Qwen3's real template over a
model scripted to think then answer (tests/tui_pilot.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.conversations import ConversationStore
from localinfer.loading.chat_template import ChatTemplate
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn
from localinfer.tui.host import ChatHost
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from localinfer.tui.thinking_block import ThinkingBlock
from tests.tui_pilot import SIZE, ScriptedChatSession, StepClock, wait_until

QWEN3 = Path(__file__).parent / "fixtures" / "templates" / "Qwen-Qwen3-0.6B.jinja"
THOUGHT = "The user asks for 2+2. " * 20 + "So: 4."
ANSWER = "It is **4**."


@pytest.fixture(scope="module")
def thinker():
    session = ScriptedChatSession(f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
    session.model.chat_template = ChatTemplate(QWEN3.read_text(), eos_token="<|im_end|>")
    yield session
    session.close()


async def test_reasoning_folds_above_the_answer(thinker, tmp_path) -> None:
    settings = ChatSettings(ctx=4096, slots=1, temperature=0.0, max_tokens=500)
    app = ChatApp(
        ChatHost(settings, session=thinker), ConversationStore(tmp_path), clock=StepClock()
    )
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.load_text("What is 2+2?")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.conversation.messages and not app.answering, 60)
        await app.workers.wait_for_complete()
        await pilot.pause()
        block = app.query_one(ThinkingBlock)
        answer = app.query_one(AnswerTurn)
        assert block.text == THOUGHT and answer.source == ANSWER
        assert app.conversation.messages[-1].content == ANSWER  # the history holds no reasoning
        children = list(app.view.children)
        assert children.index(block) + 1 == children.index(answer)
        assert not block.expanded and block.summary.startswith("▸ Thought for ")
        await pilot.click(ThinkingBlock)
        assert block.expanded
        await pilot.click(ThinkingBlock)
        assert not block.expanded
