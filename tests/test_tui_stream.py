"""A long answer streamed through the real chat app: rendered right, and rendered in few updates.

The real engine streams a fixed Markdown answer of more than 1,000 tokens (headings, lists, fenced
Python, paragraphs) to the real app, headless. The app's clock is a StepClock, so the stream
pump's throttling depends on how often it reads the time, never on how fast this machine runs:
the number of renders is bounded by what the clock says elapsed, and is far below the number of
tokens. The answer on screen must be the Markdown widget the whole text makes at once, and a
snapshot shows its end (syntax-highlighted code included).
"""

from __future__ import annotations

import time

import pytest

from localinfer.conversations import ConversationStore
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn
from localinfer.tui.host import ChatHost, MemoryFigures, MemoryParts
from localinfer.tui.live_stats import StatsSnapshot
from localinfer.tui.memory_bar import MemoryBar
from localinfer.tui.messages import AnswerDelta, AnswerStatsUpdated
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from localinfer.tui.stats_panel import StatsPanel
from localinfer.tui.stream_pump import STATS_UPDATES_PER_SECOND, TEXT_UPDATES_PER_SECOND
from tests.tui_pilot import ScriptedChatSession, StepClock, wait_until

SIZE = (130, 40)
MiB = 2**20


def long_answer() -> str:
    """A Markdown answer of more than 1,000 tokens that ends in a code block and a line."""
    parts = ["# A robot learns to paint\n"]
    names = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "last"]
    for i, name in enumerate(names, start=1):
        parts.append(f"## Part {i}: the {name} canvas\n")
        parts.append(
            f"In part {i} the robot mixes colours it has never seen before. It measures the "
            "light in the studio, notes how the blue turns grey at dusk, and tries again with "
            "a thinner brush. Every stroke is logged, and every log is read back the next "
            "morning, *slowly*, before the first coat goes on.\n"
        )
        parts.append(
            "- prime the canvas\n- mix **three** shades of the same colour\n"
            f"- leave part {i} to dry overnight\n"
        )
        if i % 4 == 0:
            parts.append(
                "```python\n"
                f"def mix(colours: list[str], part: int = {i}) -> str:\n"
                '    """Blend the colours evenly; later parts use thinner paint."""\n'
                "    ratio = 1 / len(colours)\n"
                "    return ' + '.join(f'{ratio:.2f} {c}' for c in colours)\n"
                "```\n"
            )
    parts.append(
        "The gallery opened on a Sunday morning, and the robot painted the visitors as they "
        "came in, one by one, until the light was gone.\n"
    )
    return "\n".join(parts)


ANSWER = long_answer()


@pytest.fixture(scope="module")
def scripted():
    session = ScriptedChatSession(ANSWER)
    assert len(session.tokens) >= 1000
    yield session
    session.close()


class CountingApp(ChatApp):
    """The real app, counting the updates its stream worker sent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deltas = 0
        self.stats_updates = 0

    # Run beside the app's own handlers (Textual runs every class's handler of a message).
    def on_answer_delta(self, message: AnswerDelta) -> None:
        self.deltas += 1

    def on_answer_stats_updated(self, message: AnswerStatsUpdated) -> None:
        self.stats_updates += 1


def make_app(session, tmp_path, clock=None) -> CountingApp:
    settings = ChatSettings(ctx=4096, slots=1, temperature=0.0, max_tokens=2000)
    host = ChatHost(settings, session=session)
    return CountingApp(host, ConversationStore(tmp_path), clock=clock or StepClock())


async def stream_answer(pilot) -> None:
    app = pilot.app
    prompt = app.query_one(PromptInput)
    prompt.cursor_blink = False  # a blinking cursor is a coin toss in a snapshot
    prompt.load_text("Tell me about the robot who paints.")
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.conversation.messages and not app.answering)
    await app.workers.wait_for_complete()
    await pilot.pause()


def block_outline(markdown) -> list[tuple[str, str]]:
    return [(type(block).__name__, block.source) for block in markdown.children]


async def test_long_answer_renders_whole_in_coalesced_updates(scripted, tmp_path):
    clock = StepClock()
    app = make_app(scripted, tmp_path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await stream_answer(pilot)
        answer = app.query_one(AnswerTurn)
        assert answer.source == ANSWER
        assert app.conversation.messages[-1].content == ANSWER
        # Appended piece by piece, it is the document the whole text makes at once.
        whole = AnswerTurn(ANSWER)
        await app.view.mount(whole)
        await pilot.pause()
        assert block_outline(answer) == block_outline(whole)
        fences = [b for b in answer.children if type(b).__name__ == "MarkdownFence"]
        assert len(fences) == 2  # fenced Python stays a highlighted code block
        # Coalesced: no more updates than the clock allows, far fewer than tokens, and the
        # Markdown widget was updated at most once per update (plus the tail at the end).
        elapsed = clock.now - 1000.0
        tokens = len(scripted.tokens)
        assert 1 < app.deltas <= elapsed * TEXT_UPDATES_PER_SECOND + 1
        assert app.deltas < tokens / 10
        assert 1 <= answer.renders <= app.deltas + 1
        assert 1 <= app.stats_updates <= elapsed * STATS_UPDATES_PER_SECOND + 1
        assert app.query_one(StatsPanel).renders <= app.stats_updates + 2  # + send and end
        stats = app.query_one(StatsPanel).answer_text
        assert f"completion {tokens + 1} tok" in stats  # the script, then the end token


FIXED_STATS = StatsSnapshot(
    ttft_s=0.042,
    average_tps=61.5,
    tpot_s=0.0163,
    prompt_tokens=38,
    completion_tokens=1047,
    history=(20.0, 60.0, 62.0, 61.0, 58.0, 63.0, 61.0, 60.0),
)
FIXED_MEMORY = MemoryFigures(
    predicted=MemoryParts(weights=92 * MiB, kv_cache=45 * MiB, overhead=65 * MiB),
    measured=MemoryParts(weights=92 * MiB, kv_cache=45 * MiB, overhead=62 * MiB),
    available=16 * 1024 * MiB,
    device="cpu",
    reserved=103 * MiB,
)


def test_long_streamed_answer_snapshot(snap_compare, scripted, tmp_path):
    async def stream_then_fix_figures(pilot) -> None:
        await stream_answer(pilot)
        # The figures are this run's timings: fixed, so the snapshot holds the layout only.
        panel = pilot.app.query_one(StatsPanel)
        panel.show_answer(FIXED_STATS)
        panel.show_engine(None)
        pilot.app.query_one(MemoryBar).show(FIXED_MEMORY)
        await pilot.pause()

    app = make_app(scripted, tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=stream_then_fix_figures)


class PacedHost(ChatHost):
    """The chat's host with the engine's events spaced out, so the test can act mid-answer."""

    def submit(self, request):
        def paced(events):
            for event in events:
                time.sleep(0.002)
                yield event

        return paced(super().submit(request))


# The view follows from about the 300th token on (where the answer outgrows the 40-row screen);
# 600 leave as many to stream after the user scrolls up, and a next answer of 150 still grows
# the view at its end. More tokens only add paced events (2 ms each) and renders.
FIRST_ANSWER, NEXT_ANSWER = 600, 150


async def test_the_view_follows_the_answer_only_until_the_user_scrolls_up(scripted, tmp_path):
    settings = ChatSettings(ctx=4096, slots=1, temperature=0.0, max_tokens=FIRST_ANSWER)
    app = CountingApp(PacedHost(settings, session=scripted), ConversationStore(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.load_text("Tell me about the robot who paints.")
        await pilot.press("enter")
        view = app.view
        # Following: the end of the answer stays in view while it grows past the screen.
        await wait_until(pilot, lambda: view.max_scroll_y > 10)
        assert view.scroll_y == view.max_scroll_y
        assert app.answering  # more of the answer is still to come
        view.scroll_to(y=0, animate=False)  # the user scrolls up to read the beginning
        await wait_until(pilot, lambda: not app.answering)
        await pilot.pause()
        first = scripted.model.tokenizer.decode(scripted.tokens[:FIRST_ANSWER])
        assert app.query_one(AnswerTurn).source == first
        assert view.scroll_y == 0 < view.max_scroll_y  # left where the user put it
        view.scroll_end(animate=False)  # back at the end: following again
        await pilot.pause()
        app.host.settings = settings.changed(max_tokens=NEXT_ANSWER)
        before = view.max_scroll_y
        prompt.load_text("Once more, please.")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.answering)
        await pilot.pause()
        assert view.max_scroll_y > before + 10  # the next answer grew the view
        assert view.scroll_y == view.max_scroll_y
