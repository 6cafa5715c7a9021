"""Snapshot tests (pytest-textual-snapshot) of the chat's main screen and the model picker.

Deterministic by construction: a fixed conversation instead of a generated one, a fixed memory
reading instead of the live one, a fixed model list instead of this machine's, no answer
streaming (so no live figures) and a steady cursor. The session is real (llama.cpp backend, so
the header reads the same on every machine that has it). Update with `pytest
tests/test_tui_snapshots.py --snapshot-update` after a deliberate layout change, and look at the
report first. Snapshots live in tests/__snapshots__/test_tui_snapshots/.
"""

from __future__ import annotations

import pytest

from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.host import ChatHost, MemoryFigures, MemoryParts, ModelChoice
from localinfer.tui.memory_bar import MemoryBar
from localinfer.tui.model_picker import ModelPickerScreen
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings

SIZE = (130, 40)
MiB = 2**20
FIXED_MEMORY = MemoryFigures(
    predicted=MemoryParts(weights=92 * MiB, kv_cache=45 * MiB, overhead=65 * MiB),
    measured=MemoryParts(weights=92 * MiB, kv_cache=45 * MiB, overhead=62 * MiB),
    available=16 * 1024 * MiB,
    device="cpu",
    reserved=103 * MiB,  # llama.cpp's compute buffers: held, mostly unwritten
)
FIXED_MODELS = [
    ModelChoice("smollm2-135m", "bundled", 307 * MiB, True, current=True),
    ModelChoice("qwen2.5-7b", "catalog", 5014 * MiB, True, note="not on disk: localinfer pull"),
    ModelChoice("gemma3-27b", "catalog", 17018 * MiB, False, note="not on disk: localinfer pull"),
    ModelChoice("my-model.gguf", "local", None, None, note="no header"),
]


@pytest.fixture(scope="module")
def session():
    pytest.importorskip("llama_cpp")
    from localinfer.session import open_session

    s = open_session(ctx=2048, slots=1, backend="llamacpp")
    yield s
    s.close()


def make_app(session, tmp_path) -> ChatApp:
    conversation = Conversation(system_prompt="You are a helpful assistant.")
    conversation.add("user", "How do I reverse a list in Python?")
    conversation.add(
        "assistant",
        "Use slicing or `reversed`:\n\n```python\nitems = [1, 2, 3]\n"
        "print(items[::-1])  # [3, 2, 1]\n```\n\n- `items.reverse()` reverses **in place**.",
    )
    host = ChatHost(ChatSettings(ctx=2048, slots=1, temperature=0.0), session=session)
    return ChatApp(host, ConversationStore(tmp_path), conversation=conversation)


async def _settle(pilot) -> None:
    pilot.app.query_one(PromptInput).cursor_blink = False  # a blinking cursor is a coin toss
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    pilot.app.query_one(MemoryBar).show(FIXED_MEMORY)
    await pilot.pause()


def test_main_screen(snap_compare, session, tmp_path):
    assert snap_compare(make_app(session, tmp_path), terminal_size=SIZE, run_before=_settle)


def test_model_picker(snap_compare, session, tmp_path):
    async def open_picker(pilot) -> None:
        await _settle(pilot)
        await pilot.app.push_screen(ModelPickerScreen(FIXED_MODELS, ctx=2048))
        await pilot.pause()

    assert snap_compare(make_app(session, tmp_path), terminal_size=SIZE, run_before=open_picker)
