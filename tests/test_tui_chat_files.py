"""The chat's keys that reach files, driven through the real app (App.run_test) on the real
engine with a scripted runner: Ctrl+F searches the saved conversations and opens one, F8 exports
the conversation to Markdown with YAML front matter, F4 keeps system-prompt presets."""

from __future__ import annotations

import json

import pytest
from textual.widgets import Input, Label, OptionList

from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.conversation_view import AnswerTurn, UserTurn
from localinfer.tui.export_screen import ExportScreen
from localinfer.tui.presets import PresetStore
from localinfer.tui.presets_screen import PresetsScreen
from localinfer.tui.search_screen import SearchScreen
from tests.tui_pilot import SIZE, ScriptedChatSession, wait_until
from tests.tui_thinking import ask, chat_app

SCRIPT = "Use `sorted`:\n\n```python\nsorted(xs)\n```"


@pytest.fixture(scope="module")
def scripted():
    session = ScriptedChatSession(SCRIPT)
    yield session
    session.close()


def saved(store: ConversationStore, question: str, answer: str, updated: str) -> Conversation:
    conversation = Conversation()
    conversation.add("user", question)
    conversation.add("assistant", answer)
    store.save(conversation)
    # save() stamps the time: set it after, so the order is the test's.
    path = store.path_for(conversation.id)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "updated": updated}))
    return conversation


async def test_search_finds_every_word_and_opens_the_hit(scripted, tmp_path):
    app = chat_app(scripted, tmp_path)
    store = app.store
    rust = saved(store, "Borrow checker errors", "Rust wants a reference.", "2025-01-02T00:00")
    saved(store, "Python list sorting", "Use sorted(xs).", "2025-01-03T00:00")
    older = saved(store, "Rust lifetimes", "Lifetimes tie references.", "2025-01-01T00:00")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.host.loaded and not app.loading)
        await pilot.press("ctrl+f")
        screen = app.screen
        assert isinstance(screen, SearchScreen)
        await pilot.press(*"rust REFERENCE")
        await wait_until(pilot, lambda: screen.hits and screen.query_one(Input).value.endswith("E"))
        assert [h.id for h in screen.hits] == [rust.id, older.id]  # newest first, both words
        labels = [str(o.prompt) for o in screen.query_one(OptionList).options]
        # The title, then the line that holds the most of the words.
        assert labels[0] == "2025-01-02 00:00  Borrow checker errors\n    Rust wants a reference."
        assert "2 conversations" in str(screen.query_one("#search-count", Label).content)
        await pilot.press("down", "down", "enter")  # to the results, then the second one
        await pilot.pause()
        assert app.conversation.id == older.id
        assert [t.content for t in app.query(UserTurn)] == ["Rust lifetimes"]
        assert [a.source for a in app.query(AnswerTurn)] == ["Lifetimes tie references."]


async def test_export_writes_markdown_with_front_matter(scripted, tmp_path):
    yaml = pytest.importorskip("yaml")
    app = chat_app(scripted, tmp_path / "conversations", temperature=0.0)
    target = tmp_path / "out" / "chat.md"
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("f8")  # nothing yet: said, no dialog
        assert not isinstance(app.screen, ExportScreen)
        app.conversation.system_prompt = "Be brief."
        await ask(pilot, "How do I sort?")
        await ask(pilot, "And reversed?")
        await pilot.press("f8")
        screen = app.screen
        assert isinstance(screen, ExportScreen)
        path_input = screen.query_one("#export-path", Input)
        assert path_input.value.endswith(f"how-do-i-sort-{app.conversation.id}.md")
        path_input.value = str(target)
        await pilot.press("enter")
        await wait_until(pilot, lambda: target.is_file())
        await app.workers.wait_for_complete()
    text = target.read_text()
    _, head, body = text.split("---\n", 2)
    meta = yaml.safe_load(head)
    assert meta["model"] == app.conversation.model and meta["model"]
    assert meta["conversation"] == app.conversation.id
    assert meta["system_prompt"] == "Be brief."
    assert meta["settings"]["temperature"] == 0.0 and meta["settings"]["ctx"] == 4096
    timing = meta["timing"]
    assert timing["answers"] == 2 and len(timing["per_answer"]) == 2
    for figures in timing["per_answer"]:
        assert figures["ttft_s"] > 0 and figures["completion_tokens"] > 0
    assert timing["completion_tokens"] == sum(f["completion_tokens"] for f in timing["per_answer"])
    assert body.count("## You\n") == 2 and body.count("## Assistant\n") == 2
    assert "How do I sort?" in body and "```python\nsorted(xs)\n```" in body


async def test_export_asks_before_replacing_a_file(scripted, tmp_path):
    app = chat_app(scripted, tmp_path / "conversations")
    target = tmp_path / "chat.md"
    target.write_text("keep me")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ask(pilot, "How do I sort?")
        await pilot.press("f8")
        screen = app.screen
        screen.query_one("#export-path", Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is screen and target.read_text() == "keep me"
        assert "Enter again replaces it" in str(screen.query_one("#export-warning").render())
        await pilot.press("enter")
        await wait_until(pilot, lambda: target.read_text().startswith("---\n"))


async def test_presets_save_use_and_delete(scripted, tmp_path):
    app = chat_app(scripted, tmp_path / "conversations")
    store = PresetStore(tmp_path / "presets.json")
    app.preset_store = store
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.conversation.system_prompt = "Answer in one sentence."
        await pilot.press("f4")
        screen = app.screen
        assert isinstance(screen, PresetsScreen)
        assert screen.query_one("#preset-name", Input).has_focus  # none yet: name one
        await pilot.press(*"terse", "enter")
        assert store.load() == {"terse": "Answer in one sentence."}
        await pilot.press("escape")
        app.conversation.system_prompt = ""
        await pilot.press("f4")
        options = app.screen.query_one(OptionList)
        assert options.has_focus
        assert [str(o.prompt) for o in options.options] == ["terse  · Answer in one sentence."]
        await pilot.press("enter")
        assert app.conversation.system_prompt == "Answer in one sentence."
        # Used from the next message: the prompt the model gets opens with it.
        assert app.conversation.prompt_messages()[0] == {
            "role": "system",
            "content": "Answer in one sentence.",
        }
        await pilot.press("f4", "delete")
        assert store.load() == {}
        await pilot.press("escape")


async def test_an_unreadable_presets_file_is_reported_and_kept(scripted, tmp_path):
    app = chat_app(scripted, tmp_path / "conversations")
    path = tmp_path / "presets.json"
    path.write_text("{ not json")
    app.preset_store = PresetStore(path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("f4")
        message = str(app.screen.query_one("#presets-message", Label).render())
        assert "unreadable presets" in message
        await pilot.press(*"x", "enter")
        assert path.read_text() == "{ not json"
