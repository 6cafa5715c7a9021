"""The scrolling conversation: user turns, streamed Markdown answers, and notices/errors."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Markdown, Static

from localinfer.conversations import Conversation


class UserTurn(Static):
    """What the user sent, shown as plain text (never interpreted as markup)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False, classes="turn user-turn")


class AnswerTurn(Markdown):
    """One assistant answer; :meth:`show` takes the whole text so far and appends only the new part.

    Textual's ``Markdown.append`` re-parses just the last block, so a long streamed answer costs
    about the same per update as a short one; fenced code is syntax-highlighted by the widget.
    """

    def __init__(self, text: str = "") -> None:
        super().__init__(text, classes="turn answer-turn")
        self._shown = len(text)

    @property
    def shown_text(self) -> str:
        return self.source

    def show(self, full_text: str) -> None:
        if len(full_text) < self._shown or not full_text.startswith(self.source[: self._shown]):
            # Should not happen with an append-only stream, but a rewrite must still render right.
            self._shown = len(full_text)
            self.update(full_text)
            return
        delta = full_text[self._shown :]
        if delta:
            self._shown = len(full_text)
            self.append(delta)

    note: str = ""  # why the answer ended early ("stopped", the token limit), shown under it


class Notice(Static):
    """A line from the app itself: an error with what to do next, or an information."""

    def __init__(self, text: str, *, error: bool = False) -> None:
        super().__init__(text, markup=False, classes="turn notice" + (" error" if error else ""))


class ConversationView(VerticalScroll):
    """Holds the turns; keeps the newest in view while an answer streams."""

    DEFAULT_CSS = """
    ConversationView { height: 1fr; }
    """

    def add_user(self, text: str) -> UserTurn:
        turn = UserTurn(text)
        self.mount(turn)
        self.scroll_end(animate=False)
        return turn

    def start_answer(self, text: str = "") -> AnswerTurn:
        turn = AnswerTurn(text)
        self.mount(turn)
        self.scroll_end(animate=False)
        return turn

    def add_notice(self, text: str, *, error: bool = False) -> Notice:
        notice = Notice(text, error=error)
        self.mount(notice)
        self.scroll_end(animate=False)
        return notice

    def end_answer(self, answer: AnswerTurn, note: str) -> None:
        """Say under an answer why it ended early."""
        answer.note = note
        self.mount(Static(note, markup=False, classes="answer-note"), after=answer)

    def follow(self) -> None:
        """Scroll to the end unless the user scrolled up to read something."""
        if self.max_scroll_y - self.scroll_y <= 3:
            self.scroll_end(animate=False)

    def clear(self) -> None:
        self.remove_children()

    def show_conversation(self, conversation: Conversation) -> None:
        self.clear()
        for message in conversation.messages:
            if message.role == "user":
                self.mount(UserTurn(message.content))
            elif message.role == "assistant":
                self.mount(AnswerTurn(message.content))
        self.scroll_end(animate=False)

    def last_answer(self) -> AnswerTurn | None:
        answers = self.query(AnswerTurn)
        return answers.last() if answers else None
