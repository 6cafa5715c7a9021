"""The real chat app, headless, over a conversation folder holding what users' folders hold: a
backup copy of a conversation, a sync tool's conflict copy, files that are not conversations, a
title that looks like markup. Ctrl+O lists what it can read and opens the copy it is asked for."""

from __future__ import annotations

import json
import shutil

from textual.widgets import Label

from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import UserTurn
from localinfer.tui.conversations_screen import ConversationsScreen
from localinfer.tui.host import ChatHost
from localinfer.tui.settings import ChatSettings
from tests.tui_pilot import SIZE, module_session, wait_until

CTX = 256
session = module_session(CTX)


def fill_folder(root) -> Conversation:
    store = ConversationStore(root)
    original = Conversation(model="smollm2-135m")
    original.add("user", "Name a colour.")
    original.add("assistant", "Blue.")
    store.save(original)
    saved = root / f"{original.id}.json"
    shutil.copy2(saved, root / f"{original.id} (1).json")
    shutil.copy2(saved, root / f"{original.id}.sync-conflict-20240101-120000.json")
    markup = Conversation(title="[/x] not [bold markup")
    markup.add("user", "[/x] hello")
    store.save(markup)
    (root / "notes.json").write_text("{ not json", encoding="utf-8")
    (root / "list.json").write_text("[]", encoding="utf-8")
    (root / "wrong.json").write_text(json.dumps({"id": 3, "messages": [1]}), encoding="utf-8")
    return original


async def test_ctrl_o_lists_copies_and_opens_the_one_chosen(session, tmp_path):
    root = tmp_path / "conversations"
    original = fill_folder(root)
    host = ChatHost(ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=4), session=session)
    app = ChatApp(host, ConversationStore(root))
    copy_id = f"{original.id} (1)"
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen), timeout=60)
        await pilot.pause()
        screen = app.screen
        ids = [s.id for s in screen.summaries]
        assert sorted(ids) == sorted(
            [
                original.id,
                copy_id,
                f"{original.id}.sync-conflict-20240101-120000",
                next(s.id for s in screen.summaries if s.title.startswith("[/x]")),
            ]
        )
        for _ in range(ids.index(copy_id)):
            await pilot.press("down")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationsScreen), timeout=60)
        assert app.conversation.id == copy_id
        assert app.conversation.messages == original.messages
        assert [t.content for t in app.query(UserTurn)] == ["Name a colour."]
        assert app.is_running and app.return_code is None


def test_a_crash_in_the_chat_is_a_failed_exit(monkeypatch, tmp_path):
    # Whatever breaks inside the app (here: its mount), `localinfer chat` must not exit 0.
    from textual.app import App

    from localinfer.cli import main

    def crash(self) -> None:
        raise RuntimeError("broken on purpose")

    monkeypatch.setenv("LOCALINFER_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(ChatHost, "load_in_background", lambda self, settings: None)
    monkeypatch.setattr(ChatApp, "on_mount", crash)
    monkeypatch.setattr(ChatApp, "run", lambda self: App.run(self, headless=True, size=SIZE))
    assert main(["chat"]) == 1


async def test_ctrl_o_says_which_files_it_could_not_read(session, tmp_path):
    """Unreadable files (not JSON, truncated, not a conversation) are not listed, and the list says
    so with their names, so a conversation that went missing is explained, not silently gone."""
    root = tmp_path / "conversations"
    original = fill_folder(root)
    truncated = (root / f"{original.id}.json").read_bytes()[:40]
    (root / "cut.json").write_bytes(truncated)
    host = ChatHost(ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=4), session=session)
    app = ChatApp(host, ConversationStore(root))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen), timeout=60)
        await pilot.pause()
        assert len(app.screen.summaries) == 4  # the readable ones are all still listed
        note = str(app.screen.query_one("#conversations-unreadable", Label).content)
        assert note.startswith("4 files could not be read and are not listed:")
        for name in ("cut.json", "list.json", "notes.json", "wrong.json"):
            assert name in note
        assert str(root) in note


async def test_opening_a_conversation_clears_the_last_answers_figures(session, tmp_path):
    """The Answer panel shows the figures of this conversation's last answer: opening another one
    clears them, as Ctrl+N does (they used to stay, describing the conversation left)."""
    root = tmp_path / "conversations"
    fill_folder(root)
    host = ChatHost(ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=4), session=session)
    app = ChatApp(host, ConversationStore(root))
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("Hi!")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.answering and len(app.conversation.messages) == 2)
        assert "completion 4 tok" in app.stats.answer_text
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen), timeout=60)
        await pilot.pause()
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationsScreen), timeout=60)
        assert "completion 0 tok" in app.stats.answer_text
        assert "TTFT       —" in app.stats.answer_text
