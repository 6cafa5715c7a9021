"""The real chat app, headless, on the embedded model: what a user sees and keeps when an answer is
cut off by quitting, and when a question goes unanswered."""

from __future__ import annotations

import pytest

from localinfer.conversations import ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import UserTurn
from localinfer.tui.host import ChatHost
from localinfer.tui.settings import ChatSettings
from tests.tui_pilot import SIZE, ForwardGate, module_session, wait_until

CTX = 256
session = module_session(CTX)


@pytest.fixture
def store(tmp_path):
    return ConversationStore(tmp_path / "conversations")


def make_app(session, store, **settings) -> ChatApp:
    base = {"ctx": CTX, "slots": 1, "temperature": 0.8, "max_tokens": 200}
    return ChatApp(ChatHost(ChatSettings(**{**base, **settings}), session=session), store)


async def test_quitting_mid_answer_keeps_the_part_that_streamed(session, store, monkeypatch):
    """Ctrl+Q while an answer streams: the chat stops the answer, saves the question and the part
    that arrived (as a stopped answer), then exits cleanly (it used to crash mounting the
    "stopped" note into a closing view, and the turn was never saved)."""
    gate = ForwardGate(session.engine.runner.forward)
    monkeypatch.setattr(session.engine.runner, "forward", gate)
    app = make_app(session, store)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("Write a very long story about a dragon.")
        await pilot.press("enter")
        # Each look lets one more forward through: the answer is mid-stream when Ctrl+Q lands
        # however fast this machine decodes (a fast one used to finish between two looks).
        await wait_until(
            pilot,
            lambda: gate.allow_one() or (app._answer is not None and bool(app._answer.source)),
        )
        assert app.answering
        await pilot.press("ctrl+q")
        gate.open()
        await wait_until(pilot, lambda: not app.is_running)
    assert app.return_code == 0
    saved = store.list()
    assert len(saved) == 1
    messages = store.load(saved[0].id).messages
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "Write a very long story about a dragon."
    assert messages[1].content.strip()


async def test_an_unanswered_question_leaves_the_view_with_the_conversation(session, store):
    """A question the model refuses (longer than the context) goes back into the prompt and out
    of the conversation; it leaves the screen too, so editing and resending it shows it once (the
    screen used to keep it: the view and the saved conversation disagreed)."""
    app = make_app(session, store, max_tokens=2)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("word " * (CTX * 2))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.answering)
        assert app.conversation.messages == []
        assert list(app.query(UserTurn)) == []
        assert app.prompt.text.startswith("word word")
        app.prompt.load_text("Hi!")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.answering)
        assert [t.content for t in app.query(UserTurn)] == ["Hi!"]
        assert [m.role for m in app.conversation.messages] == ["user", "assistant"]
