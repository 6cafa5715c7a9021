"""The chat keeps each conversation's KV on disk (issue #24): the real app (headless, through its
pilot) on the embedded model, with its disk tier beside a temporary conversations folder.

Two turns, quit; a new app and session (nothing in RAM, nothing in a slot) reopens the
conversation with Ctrl+O, and the next turn's request restores its prompt from the disk tier
instead of computing it again. The control: the same steps with ``--kv-disk off`` restore
nothing.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import pytest

from localinfer.commands import chat as chat_command
from localinfer.conversations import ConversationStore
from localinfer.errors import InvalidParameterError
from localinfer.tui.app import ChatApp
from localinfer.tui.conversations_screen import ConversationsScreen
from localinfer.tui.host import ChatHost, open_with_settings
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from localinfer.tui.stats_panel import StatsPanel
from tests.tui_pilot import SIZE, wait_until

SETTINGS = ChatSettings(ctx=1024, slots=1, threads=1, temperature=0.0, max_tokens=8)
QUESTIONS = ["Tell me about the sea.", "And about rivers?"]


def chat_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chat_command.register(parser.add_subparsers())
    return parser.parse_args(["chat", *argv])


async def send(pilot, app: ChatApp, text: str) -> None:
    before = len(app.conversation.messages)
    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)
    await pilot.press("enter")
    # Answered: the question and its answer are in the conversation.
    await wait_until(pilot, lambda: len(app.conversation.messages) == before + 2)
    await wait_until(pilot, lambda: not app.answering)


async def ready(pilot, app: ChatApp) -> None:
    await wait_until(pilot, lambda: app.host.loaded and not app.loading)


async def first_session(store: ConversationStore, opener) -> tuple[str, int]:
    """Two answered turns, a new conversation (Ctrl+N), then quit (as `localinfer chat` does:
    the app, then the host). The conversation's id, and the entries the KV tiers held after
    Ctrl+N (the conversation was still in its slot: only keeping it put it there)."""
    host = ChatHost(SETTINGS, opener=opener)
    app = ChatApp(host, store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            for question in QUESTIONS:
                await send(pilot, app, question)
            await app.workers.wait_for_complete()
            conversation_id = app.conversation.id
            await pilot.press("ctrl+n")
            await wait_until(pilot, lambda: app.conversation.id != conversation_id)
            await app.workers.wait_for_complete()
            kept = sum(tier.entries for tier in host.session.kv_tiers)
            await pilot.press("ctrl+q")
            await wait_until(pilot, lambda: not app.is_running)
    finally:
        host.close()
    return conversation_id, kept


async def reopen_and_ask(store: ConversationStore, opener, conversation_id: str) -> dict:
    """A new app and session: Ctrl+O the conversation, ask once more; the engine's reuse
    figures of that one request."""
    host = ChatHost(SETTINGS, opener=opener)
    app = ChatApp(host, store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.press("ctrl+o")
            await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen))
            await pilot.pause()
            assert [s.id for s in app.screen.summaries] == [conversation_id]
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.conversation.id == conversation_id)
            await send(pilot, app, "And about lakes?")
            reused = dict(host.engine_metrics().reused_tokens_by_source)
            stats = app.query_one(StatsPanel).answer_text
            await pilot.press("ctrl+q")
    finally:
        host.close()
    return {"reused": reused, "stats": stats}


async def test_a_reopened_conversation_restores_its_prompt_from_disk(tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    kv = chat_command.kv_tiers(chat_args(), store.root)  # the chat's default: a disk tier
    assert kv.disk == store.root / "kv"
    opener = partial(open_with_settings, kv=kv)
    conversation_id, kept = await first_session(store, opener)
    assert kept > 0
    assert any(p.is_file() for p in kv.disk.rglob("*")), "nothing was written to the disk tier"
    after = await reopen_and_ask(store, opener, conversation_id)
    assert after["reused"].get("disk", 0) > 0, after["reused"]
    assert "cached)" in after["stats"]


async def test_without_the_disk_tier_a_new_session_computes_the_prompt_again(tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    kv = chat_command.kv_tiers(chat_args("--kv-disk", "off"), store.root)
    assert kv.disk is None
    opener = partial(open_with_settings, kv=kv)
    conversation_id, _ = await first_session(store, opener)
    assert not (store.root / "kv").exists()
    after = await reopen_and_ask(store, opener, conversation_id)
    assert after["reused"].get("disk", 0) == 0 and "cached)" not in after["stats"]


def test_kv_flags_of_the_chat(tmp_path: Path):
    root = tmp_path / "conversations"
    given = chat_command.kv_tiers(
        chat_args("--kv-disk", str(tmp_path / "elsewhere"), "--kv-ram", "64MiB"), root
    )
    assert given.disk == tmp_path / "elsewhere" and given.ram == "64MiB"
    with pytest.raises(InvalidParameterError, match="--kv-disk"):
        chat_command.run(chat_args("--url", "http://127.0.0.1:9", "--kv-disk", "off"))
