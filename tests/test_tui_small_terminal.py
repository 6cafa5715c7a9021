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
from tests.tui_pilot import SIZE, ForwardGate, module_session, wait_until

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


def newest_line_visible(app) -> bool | None:
    """Whether the streaming answer's last text line is inside the conversation view (None: no
    text on screen yet)."""
    answer = app._answer
    if answer is None or not answer.children:
        return None
    block = answer.children[-1]
    content = getattr(block, "_content", None)
    width = block.content_size.width
    if content is None or not width or not block.region.height:
        return None
    last = block.content_region.y + content.get_height(block.styles, width) - 1
    view = app.view.region
    return view.y <= last < view.bottom


async def test_a_short_terminal_shows_the_newest_text_while_it_streams(
    session, tmp_path, monkeypatch
):
    """The room an answer holds below its text to grow into (RESERVE_LINES) is sized to the view:
    in a 12-row terminal it used to push the lines being written below the view's bottom, so the
    answer streamed out of sight (every sample below was False)."""
    # 40 tokens fill the 12-row terminal's view about halfway through: with the old full
    # reserve (reserve_for returning RESERVE_LINES) the samples turn False from there on, and this
    # test fails; more tokens only add samples (each one a forward and a 50 ms pause).
    settings = ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=40)
    gate = ForwardGate(session.engine.runner.forward)
    monkeypatch.setattr(session.engine.runner, "forward", gate)
    app = ChatApp(ChatHost(settings, session=session), ConversationStore(tmp_path / "c"))
    async with app.run_test(size=(60, 12)) as pilot:
        app.prompt.load_text("Write a long story about a dragon.")
        # Not pilot.press: it waits for the app to go idle, which is after the whole answer.
        app.prompt.submit()
        await wait_until(pilot, lambda: app.answering)
        seen = []
        while app.answering:
            gate.allow_one()  # one forward per sample, however fast this machine decodes
            await pilot.pause(0.05)  # a sleep, not an idle wait: samples land mid-stream
            visible = newest_line_visible(app)
            if visible is not None:
                seen.append(visible)
        # A sample may fall between a paragraph's new line and the layout that scrolls to it.
        assert len(seen) >= 5 and sum(seen) >= 0.8 * len(seen), seen


async def test_a_short_terminal_reaches_the_settings_buttons(session, tmp_path):
    """The settings form is taller than a 12-row terminal: the dialog scrolls, so focusing
    Apply brings it into view (it used to stay clipped below the dialog's edge)."""
    settings = ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=4)
    app = ChatApp(ChatHost(settings, session=session), ConversationStore(tmp_path / "c"))
    async with app.run_test(size=(40, 12)) as pilot:
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(app.screen_stack) == 2)
        await pilot.pause()
        save = app.screen.query_one("#apply")
        save.focus()
        dialog = app.screen.query_one(".dialog")

        def in_view() -> bool:  # the scroll to the focused button lands a refresh or two later
            return bool(save.region.height) and dialog.region.contains_region(save.region)

        await wait_until(pilot, in_view, timeout=30)
        assert in_view()
