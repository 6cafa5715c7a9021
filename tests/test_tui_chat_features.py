"""What people expect of a chat, driven through the real app (App.run_test) on the real engine
with a scripted runner (tests/tui_pilot.py): the help lists every key, F5 regenerates and F2
resends an edited message, each in a new branch with the old one kept saved, Ctrl+R and F3 copy
through the terminal's clipboard escape (OSC 52) with a visible confirmation, and fenced code
is highlighted."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from textual.widgets import Label, OptionList, Static, TextArea
from textual.widgets._toast import Toast
from textual.widgets.markdown import MarkdownFence

from localinfer.tui.app import ChatApp
from localinfer.tui.clipboard import CopyScreen
from localinfer.tui.conversation_view import AnswerTurn, UserTurn
from localinfer.tui.edit_screen import EditScreen
from localinfer.tui.help_screen import CHAT_KEYS, HelpScreen, key_name
from localinfer.tui.prompt_input import PromptInput
from tests.tui_pilot import SIZE, ScriptedChatSession, wait_until
from tests.tui_thinking import ask, chat_app

CODE = "items = [1, 2, 3]\nprint(items[::-1])\n"
SCRIPT = f"Reverse it:\n\n```python\n{CODE}```\n\nDone."


@pytest.fixture(scope="module")
def scripted():
    session = ScriptedChatSession(SCRIPT)
    yield session
    session.close()


def clipboard_writes(app: ChatApp) -> list[str]:
    """Record what the app writes to the terminal (the driver's output)."""
    writes: list[str] = []
    write = app._driver.write

    def recording(data: str) -> None:
        writes.append(data)
        write(data)

    app._driver.write = recording
    return writes


def osc52(text: str) -> str:
    return f"\x1b]52;c;{base64.b64encode(text.encode()).decode()}\a"


async def toasts(pilot: Any) -> list[str]:
    await pilot.pause()
    return [str(t.render()) for t in pilot.app.screen.query(Toast)]


async def test_help_lists_every_key_of_the_app(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    listed = " ".join(keys for keys, _ in CHAT_KEYS)
    for binding in ChatApp.BINDINGS:
        assert key_name(binding.key) in listed, binding.key
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        assert app.screen.active_bindings["f1"].binding.show  # the footer shows where help is
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        shown = str(app.screen.query_one("#help-keys", Static).render())
        for keys, what in CHAT_KEYS:
            assert keys in shown and what in shown
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        # ? in the prompt is a question mark; anywhere else it is the help.
        await pilot.press("question_mark")
        assert app.query_one(PromptInput).text == "?" and not isinstance(app.screen, HelpScreen)
        app.view.focus()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


async def test_f5_regenerates_in_a_branch_and_keeps_the_old_one(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("f5")  # nothing to regenerate yet: said, nothing sent
        assert "Not regenerated: there is no answer yet." in await toasts(pilot)
        await ask(pilot, "How do I reverse a list?")
        old = app.conversation
        await pilot.press("f5")
        await wait_until(pilot, lambda: app.conversation is not old and not app.answering)
        await app.workers.wait_for_complete()
        await pilot.pause()
        new = app.conversation
        assert new.id != old.id and new.branched_from == old.id
        assert new.title == "↳ How do I reverse a list?"
        said = "Regenerating in a new branch; the conversation as it was stays saved (Ctrl+O)."
        assert said in await toasts(pilot)
        assert [(m.role, m.content) for m in new.messages] == [
            ("user", "How do I reverse a list?"),
            ("assistant", SCRIPT),
        ]
        # One question and its new answer on screen; both conversations saved, the old as it was.
        assert [t.content for t in app.query(UserTurn)] == ["How do I reverse a list?"]
        assert len(app.query(AnswerTurn)) == 1
        assert app.store.load(old.id).messages == old.messages
        assert app.store.load(new.id).messages == new.messages
        assert {s.id for s in app.store.list()} == {old.id, new.id}


async def test_f2_edits_an_earlier_message_and_resends_it(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ask(pilot, "first question")
        await ask(pilot, "second question")
        old = app.conversation
        await pilot.press("f2")
        screen = app.screen
        assert isinstance(screen, EditScreen)
        text = screen.query_one("#edit-text", TextArea)
        assert text.text == "second question" and text.has_focus  # the last, ready to edit
        screen.query_one("#edit-options", OptionList).highlighted = 0
        await pilot.pause()
        assert text.text == "first question"
        text.load_text("first question, edited")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.conversation is not old and not app.answering)
        await app.workers.wait_for_complete()
        await pilot.pause()
        new = app.conversation
        assert [m.content for m in new.messages] == ["first question, edited", SCRIPT]
        assert new.branched_from == old.id and new.title == "↳ first question, edited"
        assert [t.content for t in app.query(UserTurn)] == ["first question, edited"]
        saved_old = app.store.load(old.id)
        assert [m.content for m in saved_old.messages][::2] == ["first question", "second question"]


async def test_f2_esc_changes_nothing(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ask(pilot, "a question")
        before = app.conversation
        await pilot.press("f2")
        await pilot.press("escape")
        assert app.conversation is before and len(before.messages) == 2


async def test_copy_writes_osc52_and_says_so(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ask(pilot, "How do I reverse a list?")
        writes = clipboard_writes(app)
        await pilot.press("ctrl+r")
        assert osc52(SCRIPT) in writes
        assert "Copied the last answer." in await toasts(pilot)
        # F3: the newest answer's code block first, then the whole answer.
        await pilot.press("f3")
        screen = app.screen
        assert isinstance(screen, CopyScreen)
        labels = [str(o.prompt) for o in screen.query_one(OptionList).options]
        assert labels == [
            "answer 1 · python code · 2 lines · items = [1, 2, 3]",
            "answer 1 · whole answer · 8 lines · Reverse it:",
        ]
        await pilot.press("enter")
        assert writes[-1] == osc52(CODE)
        shown = await toasts(pilot)
        assert "Copied the python code block of answer 1 (2 lines) to the clipboard." in shown


async def test_fenced_code_is_highlighted(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "How do I reverse a list?")
        fence = answer.query_one(MarkdownFence)
        assert fence.code == CODE.rstrip("\n") and fence.lexer == "python"
        code = fence.query_one("#code-content", Label).content
        styled = {code.plain[s.start : s.end] for s in code.spans}
        assert "print" in styled  # the builtin has its own colour: a highlighter ran
        assert "items" in code.plain
