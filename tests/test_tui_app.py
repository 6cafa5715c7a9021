"""The chat app driven headless (App.run_test) against the real embedded model.

One session (SmolLM2-135M on the machine's default backend) is shared by the module; each test
builds its own app and conversation store around it. Answers are kept short so the module runs in
well under a minute even on a busy 2-core machine.
"""

from __future__ import annotations

import pytest

from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn, ConversationView, Notice, UserTurn
from localinfer.tui.conversations_screen import ConversationsScreen
from localinfer.tui.host import ChatHost
from localinfer.tui.model_picker import ModelPickerScreen
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from localinfer.tui.settings_screen import SettingsScreen
from localinfer.tui.stats_panel import StatsPanel
from localinfer.tui.system_prompt_screen import SystemPromptScreen
from tests.tui_pilot import SIZE, ForwardGate, module_session, wait_until

CTX = 512
session = module_session(CTX)


@pytest.fixture
def store(tmp_path):
    return ConversationStore(tmp_path / "conversations")


class RecordingApp(ChatApp):
    """The real app, also keeping the answer as it stood after each streamed piece."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.partials: list[str] = []

    # Textual calls this beside the app's own handler of AnswerDelta (every class's handler of a
    # message runs): it records, the app's handler renders.
    def on_answer_delta(self, message) -> None:
        self.partials.append((self.partials[-1] if self.partials else "") + message.text)


def make_app(session, store, **settings) -> RecordingApp:
    base = {"ctx": CTX, "slots": 1, "temperature": 0.0, "max_tokens": 8}
    host = ChatHost(ChatSettings(**{**base, **settings}), session=session)
    return RecordingApp(host, store)


async def type_and_send(pilot, text: str) -> None:
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)
    await pilot.press("enter")


async def test_answer_streams_and_stats_show(session, store):
    app = make_app(session, store)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "What is 2+2?")
        await wait_until(pilot, lambda: not app.answering)
        await pilot.pause()
        answers = app.query(AnswerTurn)
        assert len(answers) == 1 and answers.first().source.strip()
        final = answers.first().source
        # Streamed: partial answers were on screen before the whole one.
        assert app.partials and all(final.startswith(p) for p in app.partials)
        assert len(app.partials[0]) < len(final)
        assert [t.content for t in app.query(UserTurn)] == ["What is 2+2?"]
        stats = app.query_one(StatsPanel).answer_text
        ttft = next(line for line in stats.splitlines() if line.startswith("TTFT"))
        average = next(line for line in stats.splitlines() if line.startswith("average"))
        assert ttft.endswith((" ms", " s")) and "—" not in ttft
        assert average.endswith("tok/s") and "—" not in average
        assert "completion 8 tok" in stats
        roles = [m.role for m in app.conversation.messages]
        assert roles == ["user", "assistant"]
        assert app.conversation.messages[1].content == answers.first().source
        # Saved after the answer, and the prompt is empty and ready again.
        await app.workers.wait_for_complete()
        assert store.load(app.conversation.id).messages == app.conversation.messages
        assert app.query_one(PromptInput).text == ""


async def test_escape_stops_mid_answer(session, store, monkeypatch):
    gate = ForwardGate(session.engine.runner.forward)
    monkeypatch.setattr(session.engine.runner, "forward", gate)
    app = make_app(session, store, max_tokens=400)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "Write a very long story about a dragon and a knight.")
        # Each look lets one more forward through, until text has arrived.
        await wait_until(
            pilot,
            lambda: gate.allow_one() or (app._answer is not None and bool(app._answer.source)),
        )
        # A dialog opened mid-answer: the stream keeps landing, and Esc closes the dialog only.
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: isinstance(app.screen, SystemPromptScreen))
        shown = len(app._answer.source)
        await wait_until(pilot, lambda: gate.allow_one() or len(app._answer.source) > shown)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, SystemPromptScreen))
        assert app.answering
        await pilot.press("escape")
        gate.open()
        await wait_until(pilot, lambda: not app.answering)
        answer = app.query(AnswerTurn).last()
        assert answer.note == "⏹ stopped"
        assert "completion" in app.query_one(StatsPanel).answer_text
        assert session.engine.metrics().finish_reasons.get("abort", 0) >= 1
        # The partial answer stays in the conversation.
        assert app.conversation.messages[-1].role == "assistant"
        assert app.conversation.messages[-1].content == answer.source


async def test_settings_change_the_next_request(session, store):
    app = make_app(session, store, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#temperature").value = "0"
        screen.query_one("#max_tokens").value = "3"
        screen.query_one("#max_tokens").focus()
        await pilot.press("enter")  # Enter in a field applies the form
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.host.settings.max_tokens == 3 and not app.loading  # no reload needed
        await type_and_send(pilot, "Tell me about the sea.")
        await wait_until(pilot, lambda: not app.answering)
        assert "completion 3 tok" in app.query_one(StatsPanel).answer_text
        assert "max-tokens limit" in app.query(AnswerTurn).last().note


async def test_bad_setting_is_refused_in_the_form(session, store):
    app = make_app(session, store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#top_p").value = "7"
        app.screen.query_one("#top_p").focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert "top_p" in str(app.screen.query_one("#settings-error").content)
        await pilot.press("escape")  # the dialog's Esc cancels (the app's Esc is for answers)
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.host.settings.top_p == ChatSettings().top_p


async def test_saved_conversation_reopens(session, store):
    saved = Conversation(system_prompt="You are terse.", model="smollm2-135m")
    saved.add("user", "Name a colour.")
    saved.add("assistant", "Blue.\n\n```python\nprint('blue')\n```")
    store.save(saved)
    app = make_app(session, store, max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationsScreen))
        assert app.conversation.id == saved.id
        assert app.conversation.messages == saved.messages
        assert app.conversation.system_prompt == "You are terse."
        assert [t.content for t in app.query(UserTurn)] == ["Name a colour."]
        assert [a.source for a in app.query(AnswerTurn)] == [saved.messages[1].content]
        # Continuing the reopened conversation sends its history to the model.
        await type_and_send(pilot, "And another?")
        await wait_until(pilot, lambda: not app.answering)
        assert [m.role for m in app.conversation.messages] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        await pilot.press("ctrl+r")
        assert app.clipboard == app.conversation.messages[-1].content


async def test_overlong_prompt_shows_error_and_app_keeps_working(session, store):
    app = make_app(session, store, max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "word " * (CTX * 2))
        await wait_until(pilot, lambda: not app.answering)
        errors = [n for n in app.query(Notice) if n.has_class("error")]
        assert len(errors) == 1
        assert "context" in str(errors[0].content) and "Ctrl+N" in str(errors[0].content)
        assert app.conversation.messages == []  # the unanswered turn was taken back
        assert app.query_one(PromptInput).text.startswith("word word")  # and kept for editing
        app.query_one(PromptInput).clear()
        await type_and_send(pilot, "Hi!")
        await wait_until(pilot, lambda: not app.answering)
        assert [m.role for m in app.conversation.messages] == ["user", "assistant"]


async def test_new_conversation_and_system_prompt(session, store):
    app = make_app(session, store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+t")
        await pilot.pause()
        app.screen.query_one("#system-text").load_text("Always answer in French.")
        await pilot.press("ctrl+n")  # app keys are off while a dialog is open
        assert len(app.screen_stack) == 2
        await pilot.click("#save")
        await pilot.pause()
        assert app.conversation.system_prompt == "Always answer in French."
        app.conversation.add("user", "Hello")
        app.query_one(ConversationView).add_user("Hello")
        assert app.conversation.prompt_messages()[0] == {
            "role": "system",
            "content": "Always answer in French.",
        }
        first_id = app.conversation.id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.conversation.id != first_id and app.conversation.messages == []
        assert app.conversation.system_prompt == "Always answer in French."
        assert len(app.query(UserTurn)) == 0


async def test_enter_sends_and_ctrl_j_adds_a_newline(session, store):
    app = make_app(session, store, max_tokens=2)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press("a", "ctrl+j", "b")
        assert prompt.text == "a\nb"
        assert not app.answering
        await pilot.press("enter")
        assert prompt.text == ""  # sent (the answer may already be done: 2 tokens)
        assert app.conversation.messages[0].content == "a\nb"
        await wait_until(pilot, lambda: not app.answering)
        await pilot.press("up")
        assert prompt.text == "a\nb"  # history brings the sent prompt back


async def test_startup_load_model_picker_and_failed_switch(store):
    """The app loads its model in a worker, lists models with their fit, and survives a failed
    switch (a catalog model that is not on disk) by restoring the model it had."""
    host = ChatHost(ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=4))
    app = ChatApp(host, store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            assert app.loading and app.spinner.running and app.spinner.display
            await pilot.press("h", "i")  # the UI answers keys while the model loads
            assert app.query_one(PromptInput).text == "hi"
            await wait_until(pilot, lambda: not app.loading)
            first = host.session
            await pilot.press("ctrl+l")
            await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen))
            choices = {c.name: c for c in app.screen.choices}
            assert choices["smollm2-135m"].current and choices["smollm2-135m"].fits
            missing = next(c for c in choices.values() if c.source == "catalog")
            assert "localinfer pull" in missing.note
            app.screen.dismiss(missing.name)
            await wait_until(pilot, lambda: app.loading)
            await wait_until(pilot, lambda: not app.loading)
            errors = [str(n.content) for n in app.query(Notice) if n.has_class("error")]
            assert len(errors) == 1 and "Still using" in errors[0]
            assert host.loaded and host.session is not first  # reopened
            assert host.settings.model is None  # the failed choice was not kept
            await pilot.press("enter")
            await wait_until(pilot, lambda: not app.answering)
            assert [m.role for m in app.conversation.messages] == ["user", "assistant"]
    finally:
        host.close()
