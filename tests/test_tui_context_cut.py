"""A conversation longer than the context in the real chat app (#39): the embedded model at
ctx 2048 through the app's own opener (the engine with chunk reuse, as `localinfer chat` opens
it), 60 turns of ~50-token questions and 8-token answers.

- every turn is answered, and once the conversation outgrows the context the line marking where
  the model's context begins is drawn above the first message it still sees, with the count of
  the messages above it;
- the first answer after each cut reuses the kept turns' cached KV (the engine's cached_tokens:
  all but the new question), and the prompt sent is the conversation from the line on;
- the saved file reopens with the same view, the line included;
- ``summarize`` keeps the model's summary as a note above the line, sends it in the system
  prompt, and saves it; ``stop`` refuses as before.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from localinfer.context_fit import SUMMARY_OPENING, outside_count
from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.context_marker import ContextMarker, SummaryNote
from localinfer.tui.conversation_view import AnswerTurn, ConversationView, UserTurn
from localinfer.tui.host import ChatHost, open_with_settings
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from tests.tui_pilot import SIZE, wait_until

SETTINGS = ChatSettings(ctx=2048, slots=1, threads=1, temperature=0.0, max_tokens=8)
FILLER = "the river runs past the old mill and the green hills where the sheep graze in spring"


def question(i: int) -> str:
    return f"Question {i}: tell me one thing about {FILLER}, number {i}."


class RecordingHost(ChatHost):
    """The chat's host, keeping each answer's last event (its metrics) and prompt messages."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finals: list[Any] = []
        self.ids: list[str] = []
        self.sent: list[list[dict[str, str]]] = []

    def stream(self, prompt: Any, params: Any, request_id: str) -> Any:
        self.sent.append(prompt.messages)
        self.ids.append(request_id)
        for event in super().stream(prompt, params, request_id):
            if event.finish_reason is not None:
                self.finals.append(event)
            yield event


def view_signature(view: ConversationView) -> list[tuple[str, str]]:
    """What the view shows, in order: the turns, the summaries and the line."""
    out = []
    for child in view.children:
        if isinstance(child, UserTurn | SummaryNote | ContextMarker):
            out.append((type(child).__name__, str(child.render())))
        elif isinstance(child, AnswerTurn):
            out.append(("AnswerTurn", child.source))
    return out


async def send(pilot: Any, app: ChatApp, text: str) -> None:
    """Send ``text`` and wait for its answer, or for the notice that it was not answered."""
    before = len(app.conversation.messages), len(app.query(".notice.error"))
    prompt = app.query_one(PromptInput)
    prompt.load_text(text)
    await pilot.press("enter")

    def ended() -> bool:
        now = len(app.conversation.messages), len(app.query(".notice.error"))
        return not app.answering and (now[0] > before[0] + 1 or now[1] > before[1])

    await wait_until(pilot, ended)


@pytest.mark.slow  # about a minute on 2 cores: scripts/test --all runs it
async def test_sixty_turns_past_the_context(tmp_path) -> None:
    store = ConversationStore(tmp_path)
    host = RecordingHost(SETTINGS, opener=partial(open_with_settings, kv=None))
    app = ChatApp(host, store)
    starts = []
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: host.loaded and not app.loading)
            for i in range(60):
                await send(pilot, app, question(i))
                assert app.conversation.messages[-1].role == "assistant", f"turn {i}"
                starts.append(app.conversation.context_start)
            await app.workers.wait_for_complete()
            conversation = app.conversation
            shown = view_signature(app.view)
            errors = [n for n in app.query(".notice.error")]
            assert not errors, [str(n.render()) for n in errors]
            # Reopened from its file in the same app: the same view, the line included.
            await pilot.press("ctrl+n")
            app.open_conversation(conversation.id)
            await pilot.pause()
            assert view_signature(app.view) == shown
    finally:
        host.close()
    assert sum(m.role == "assistant" for m in conversation.messages) == 60
    cuts = [i for i in range(1, 60) if starts[i] > starts[i - 1]]
    assert starts[0] == 0 and len(cuts) >= 2, starts  # it outgrew the context, more than once
    # The line: one, above the first message the model sees, counting the ones above it.
    markers = [s for s in shown if s[0] == "ContextMarker"]
    outside = outside_count(conversation.messages, conversation.context_start)
    assert markers == [
        ("ContextMarker", f"── {outside} earlier messages are outside the model's context ──")
    ]
    first_seen = conversation.messages[conversation.context_start].content
    at = shown.index(markers[0])
    assert shown[at + 1] == ("UserTurn", first_seen)
    # The prompt sent is the conversation from the line on (no system prompt was set).
    assert host.sent[-1][0]["content"] == first_seen
    saved = store.load(conversation.id)
    assert saved.context_start == conversation.context_start
    # After each cut the kept turns' KV was reused: only the new question was prefilled.
    for i in cuts:
        metrics = host.finals[i].metrics
        assert metrics.prompt_tokens - metrics.cached_tokens < 80, (i, metrics)


def seeded(store: ConversationStore, turns: int) -> str:
    """A saved conversation of ``turns`` answered questions, inside the context: the app reopens
    it and goes on from there, so only the turns around the cuts are generated (the test is what
    the app does at a cut; sixty answered turns are test_sixty_turns_past_the_context's)."""
    conversation = Conversation(model="smollm2-135m")
    for i in range(turns):
        conversation.add("user", question(i))
        conversation.add("assistant", f"Oaks grow on hill {i}.")  # 8 tokens, as the app's
    store.save(conversation)
    return conversation.id


async def run_turns(
    settings: ChatSettings, store: ConversationStore, first: int, turns: int
) -> Any:
    """Questions ``first`` to ``turns - 1`` through the app, after reopening a saved conversation
    of the ``first`` before them; the app's host, conversation and view as shown, the view again
    after the saved file was reopened, and the notices."""
    saved = seeded(store, first)
    host = RecordingHost(settings, opener=partial(open_with_settings, kv=None))
    app = ChatApp(host, store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: host.loaded and not app.loading)
            app.open_conversation(saved)
            await pilot.pause()
            for i in range(first, turns):
                await send(pilot, app, question(i))
            await app.workers.wait_for_complete()
            conversation, shown = app.conversation, view_signature(app.view)
            notices = [str(n.render()) for n in app.query(".notice")]
            await pilot.press("ctrl+n")
            app.open_conversation(conversation.id)
            await pilot.pause()
            reopened = view_signature(app.view)
    finally:
        host.close()
    return host, conversation, shown, reopened, notices


async def test_summarize_keeps_the_summary_as_a_note_above_the_line(tmp_path) -> None:
    # A small context, so that few saved turns fill it: the first question's summary prefills
    # the reopened conversation (329 tokens here; 429 at ctx 512 with seven saved turns). At 368
    # every decision has 12 tokens or more to spare (the two cuts, the whole conversation in the
    # first summary's prompt, the third question's room); ctx 352 leaves 1 for that prompt, 384
    # leaves 3 for the second question, which there is not cut.
    settings = SETTINGS.changed(ctx=368, context_overflow="summarize")
    store = ConversationStore(tmp_path)
    # Five saved turns, then three asked: the first and the second outgrow the context, each
    # cut with its summary.
    host, conversation, shown, reopened, _ = await run_turns(settings, store, 5, 8)
    assert sum(m.role == "assistant" for m in conversation.messages) == 8
    assert len(host.finals) == 5  # three answers and two summaries
    notes = [m for m in conversation.messages if m.role == "system"]
    assert notes and all(m.content for m in notes)
    start = conversation.context_start
    assert conversation.messages[start - 1] is notes[-1]  # right above the first one kept
    kinds = [kind for kind, _ in shown]
    assert kinds.count("SummaryNote") == len(notes) and kinds.count("ContextMarker") == 1
    assert kinds[kinds.index("ContextMarker") - 1] == "SummaryNote"
    # The model reads the latest summary in the system prompt, then the turns from the line.
    sent = host.sent[-1]
    assert sent[0] == {"role": "system", "content": f"{SUMMARY_OPENING} {notes[-1].content}"}
    assert sent[1]["content"] == conversation.messages[start].content
    assert reopened == shown
    assert store.load(conversation.id).messages[start - 1].content == notes[-1].content
    # The summary's generation left the kept turns cached: the question after it moved their KV
    # into place and prefilled only the new system prompt and the question.
    summaries = [i for i, rid in enumerate(host.ids) if rid.endswith("-summary")]
    assert summaries and summaries[-1] + 1 < len(host.finals)
    for i in summaries:
        metrics = host.finals[i + 1].metrics
        assert metrics.prompt_tokens - metrics.cached_tokens < 120, (i, metrics)


async def test_stop_refuses_the_question_that_does_not_fit(tmp_path) -> None:
    # A small context, so that few saved turns fill it (the first question prefills them all:
    # 311 tokens here, 461 at ctx 512 with eight turns); the second question's prompt leaves
    # 22 tokens free, the third's is ~30 past the context.
    settings = SETTINGS.changed(ctx=384, context_overflow="stop")
    store = ConversationStore(tmp_path)
    # Five saved turns, then four asked: two fit, the third and fourth are refused.
    host, conversation, shown, _, notices = await run_turns(settings, store, 5, 9)
    assert conversation.context_start == 0
    assert not [kind for kind, _ in shown if kind in ("ContextMarker", "SummaryNote")]
    refused = [n for n in notices if n.startswith("Not answered") and "maximum context" in n]
    assert len(refused) == 2 and sum(m.role == "assistant" for m in conversation.messages) == 7
    assert len(host.finals) == 2
