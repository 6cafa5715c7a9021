"""The real chat app, headless, in small terminals: it keeps running and answering (a 40-column
terminal used to crash it: the 44-column figures panel left the prompt no width, and wrapping
its placeholder into zero columns raised)."""

from __future__ import annotations

import pytest

from localinfer.conversations import ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn
from localinfer.tui.host import ChatHost
from localinfer.tui.settings import ChatSettings
from tests.tui_pilot import SIZE, module_session, wait_until

CTX = 256
session = module_session(CTX)


@pytest.mark.parametrize("size", [(40, 12), (20, 8), (4, 3)])
async def test_a_small_terminal_keeps_the_chat_running(session, tmp_path, size):
    host = ChatHost(ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=4), session=session)
    app = ChatApp(host, ConversationStore(tmp_path / "conversations"))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        app.prompt.load_text("Hi!")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.answering)
        await pilot.pause()
        assert app.is_running
        assert app.query(AnswerTurn).last().source.strip()
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        assert app.query_one("#side").display
        await pilot.resize_terminal(*size)
        await pilot.pause()
        assert app.is_running
