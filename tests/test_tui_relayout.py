"""The streaming answer's last paragraph holds blank lines to grow into, so a new line of text
repaints it without laying out the whole conversation each time (conversation_view.py, #23):
layouts are far fewer than lines, the reserve moves to whichever paragraph is last, and the
finished answer is laid out exactly as the same text shown at once."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.screen import Screen

from localinfer.tui.conversation_view import AnswerTurn, ConversationView, StreamParagraph

WORDS = "the robot mixed a careful blue with the grey of the workshop floor and waited "


class ViewApp(App[None]):
    def compose(self) -> ComposeResult:
        yield ConversationView()


def paragraphs(answer: AnswerTurn) -> list[StreamParagraph]:
    return [b for b in answer.children if isinstance(b, StreamParagraph)]


async def test_a_growing_paragraph_costs_few_layouts_and_gives_its_reserve_back(monkeypatch):
    layouts = []
    refresh_layout = Screen._refresh_layout

    def counted(self, *args, **kwargs):
        layouts.append(1)
        return refresh_layout(self, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    app = ViewApp()
    async with app.run_test(size=(60, 30)) as pilot:
        view = app.query_one(ConversationView)
        answer = view.start_answer()
        await pilot.pause()
        text = ""
        for _ in range(60):  # ~60 lines of 60 columns: a word or two at a time
            text += WORDS
            await answer.write(WORDS)
            await pilot.pause()
        lines = paragraphs(answer)[0].content_size.height
        assert lines >= 40
        before = len(layouts)
        last = paragraphs(answer)[0]
        assert last.reserved and last.styles.min_height is not None, before
        assert last.content_size.height >= lines  # text plus the blank lines held below it
        assert before < lines, (before, lines)  # a line cost ~2 layouts before

        second_text = "\n\nA second paragraph starts. " + WORDS * 2
        await answer.write(second_text)
        await pilot.pause()
        await answer.write(WORDS)  # it grows past the height it was mounted with
        await pilot.pause()
        first, second = paragraphs(answer)
        assert not first.reserved and first.styles.min_height is None
        assert second.reserved

        await answer.end_stream()
        await pilot.pause()
        assert not any(p.reserved for p in paragraphs(answer))
        assert answer.styles.min_height is None
        streamed_height = answer.outer_size.height
        shown = view.start_answer(text + second_text + WORDS)
        await pilot.pause()
        assert shown.outer_size.height == streamed_height
