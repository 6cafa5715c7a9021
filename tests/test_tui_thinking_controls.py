"""The chat's thinking controls, headless, on the real engine and real thinking templates (a
model scripted to think then answer, which answers at once after a prompt that closed the
reasoning block: tests/tui_thinking.py): Settings turns thinking off or caps it with a budget,
Ctrl+G shows or folds every reasoning block (listed in the footer only where there is reasoning),
and /think or /no_think typed with a message sets thinking for that message: kept in the message
for Qwen3, which reads it, taken out and applied through the template for DeepSeek-R1, which
does not, saying so."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Label, Select

from localinfer.tui.conversation_view import Notice
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings_screen import SettingsScreen
from localinfer.tui.thinking_block import ThinkingBlock
from tests.tui_pilot import SIZE, ScriptedChatSession, wait_until
from tests.tui_thinking import ANSWER, THOUGHT, ask, chat_app, qwen3_session, r1_session


@pytest.fixture(scope="module")
def qwen3():
    session = qwen3_session()
    yield session
    session.close()


@pytest.fixture(scope="module")
def r1():
    session = r1_session()
    yield session
    session.close()


async def open_settings(pilot) -> SettingsScreen:
    await pilot.press("ctrl+s")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen))
    return pilot.app.screen


async def apply_settings(pilot, screen: SettingsScreen) -> None:
    screen.query_one("#thinking_budget", Input).focus()
    await pilot.press("enter")  # Enter in a field applies the form
    await wait_until(pilot, lambda: not isinstance(pilot.app.screen, SettingsScreen))


def switch_notices(app) -> list[str]:
    return [str(n.content) for n in app.query(Notice) if "/no_think" in str(n.content)]


async def test_thinking_off_in_settings_leaves_no_reasoning_block(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_settings(pilot)
        assert "reasons before it answers" in str(screen.query_one("#thinking-help", Label).content)
        screen.query_one("#thinking", Select).value = "off"
        await apply_settings(pilot, screen)
        assert app.host.settings.thinking is False and not app.loading  # no reload
        answer = await ask(pilot, "What is 2+2?")
        assert not app.query(ThinkingBlock)
        assert answer.source == ANSWER
        assert qwen3.runner.prompts[-1].endswith("<think>\n\n</think>\n\n")  # closed by Qwen3
        assert "thinking off" in str(app.settings_summary.content)


async def test_budget_caps_the_reasoning_block(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_settings(pilot)
        screen.query_one("#thinking_budget", Input).value = "6"
        await apply_settings(pilot, screen)
        assert app.host.settings.thinking_budget == 6
        answer = await ask(pilot, "What is 2+2?")
        block = app.query_one(ThinkingBlock)
        assert 0 < len(qwen3.encode(block.text)) <= 6
        assert THOUGHT.startswith(block.text) and block.text != THOUGHT
        assert answer.source == ANSWER  # the answer follows the forced closing tag


async def test_a_blank_budget_is_no_cap_and_a_bad_one_is_refused(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path, thinking_budget=6)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_settings(pilot)
        screen.query_one("#thinking_budget", Input).value = "-1"
        await apply_settings_refused(pilot, screen, "thinking budget")
        screen.query_one("#thinking_budget", Input).value = " "
        await apply_settings(pilot, screen)
        assert app.host.settings.thinking_budget is None
        await ask(pilot, "What is 2+2?")
        assert app.query_one(ThinkingBlock).text == THOUGHT


async def apply_settings_refused(pilot, screen: SettingsScreen, field: str) -> None:
    screen.query_one("#thinking_budget", Input).focus()
    await pilot.press("enter")
    await pilot.pause()
    assert pilot.app.screen is screen
    assert field in str(screen.query_one("#settings-error", Label).content)


async def test_settings_say_a_model_that_does_not_think_ignores_them(tmp_path) -> None:
    session = ScriptedChatSession("Four.")  # the embedded model's own template: no thinking
    try:
        app = chat_app(session, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            assert "ctrl+g" not in app.screen.active_bindings  # nothing to show: not listed
            screen = await open_settings(pilot)
            help_text = str(screen.query_one("#thinking-help", Label).content)
            assert "does not think" in help_text
            assert screen.query_one("#thinking", Select).disabled
            assert screen.query_one("#thinking_budget", Input).disabled
    finally:
        session.close()


async def test_the_key_shows_and_folds_every_reasoning_block(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert app.screen.active_bindings["ctrl+g"].binding.description == "Thinking"
        await ask(pilot, "What is 2+2?")
        await ask(pilot, "And 3+3?")
        blocks = list(app.query(ThinkingBlock))
        assert len(blocks) == 2 and not any(b.expanded for b in blocks)
        assert all(str(b.content).startswith("▸ Thought for ") for b in blocks)
        await pilot.press("ctrl+g")
        assert all(b.expanded and str(b.content) == THOUGHT for b in blocks)
        await ask(pilot, "And 4+4?")  # shown: a new block stays open once its answer starts
        blocks = list(app.query(ThinkingBlock))
        assert len(blocks) == 3 and all(b.expanded for b in blocks)
        await pilot.press("ctrl+g")
        assert not any(b.expanded for b in blocks)
        assert all(str(b.content).startswith("▸ Thought") for b in blocks)


async def test_no_think_in_a_qwen3_message_stays_in_it(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "What is 2+2? /no_think")
        assert answer.source == ANSWER and not app.query(ThinkingBlock)
        assert app.conversation.messages[0].content == "What is 2+2? /no_think"  # Qwen3 reads it
        prompt = qwen3.runner.prompts[-1]
        assert "What is 2+2? /no_think<|im_end|>" in prompt and prompt.endswith("</think>\n\n")
        assert not switch_notices(app)
        await ask(pilot, "And 3+3?")  # for that message only: the setting applies again
        assert app.query_one(ThinkingBlock).text == THOUGHT


async def test_think_turns_thinking_on_for_one_message(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path, thinking=False)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "/think What is 2+2?")
        assert app.query_one(ThinkingBlock).text == THOUGHT
        await ask(pilot, "And 3+3?")
        assert len(app.query(ThinkingBlock)) == 1


async def test_no_think_where_the_model_does_not_know_it(r1, tmp_path) -> None:
    app = chat_app(r1, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "/no_think What is 2+2?")
        assert answer.source == ANSWER and not app.query(ThinkingBlock)
        assert app.conversation.messages[0].content == "What is 2+2?"  # taken out
        assert r1.runner.prompts[-1].endswith("<think>\n</think>")  # closed by the template
        (notice,) = switch_notices(app)
        assert "no /no_think of its own" in notice and "off for this message" in notice
        await ask(pilot, "And 3+3?")
        assert app.query_one(ThinkingBlock).text == THOUGHT  # opened by R1's template


async def test_a_switch_alone_is_not_sent(qwen3, tmp_path) -> None:
    app = chat_app(qwen3, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.load_text("/no_think")
        await pilot.press("enter")
        await pilot.pause()
        assert not app.conversation.messages and not app.answering
        assert prompt.text == "/no_think"  # kept, to add the message to
