"""Where the model's context begins (#39): the line drawn above the first message the model still
sees, and the summary notes that stand in for the messages above it.

Everything stays on the screen and in the saved file: the line says how many earlier messages
the model no longer sees. There is one line, moved down at each cut; the summaries (the
``summarize`` policy) stay where each cut put them, above the line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widget import Widget
from textual.widgets import Static

from localinfer.context_fit import describe_outside, outside_count, window_start

if TYPE_CHECKING:
    from localinfer.conversations import Conversation

SUMMARY_LABEL = "Summary of the earlier messages (the model reads it in their place):"


class ContextMarker(Static):
    """'── 12 earlier messages are outside the model's context ──'."""

    DEFAULT_CSS = """
    ContextMarker { color: $warning; text-align: center; text-style: bold; }
    """

    def __init__(self, outside: int) -> None:
        self.outside = outside
        text = f"── {describe_outside(outside)} ──"
        super().__init__(text, markup=False, classes="turn context-marker")


class SummaryNote(Static):
    """A summary the model wrote of the messages a cut left out (a "system" message saved in
    the conversation)."""

    DEFAULT_CSS = """
    SummaryNote { border-left: thick $warning; }
    """

    def __init__(self, summary: str) -> None:
        self.summary = summary
        super().__init__(f"{SUMMARY_LABEL} {summary}", markup=False, classes="turn notice summary")


def marker_for(conversation: Conversation, index: int) -> ContextMarker | None:
    """The line to draw above ``conversation.messages[index]`` (None: not there)."""
    start = window_start(conversation.messages, conversation.context_start)
    outside = outside_count(conversation.messages, start)
    return ContextMarker(outside) if index == start and outside else None


def place_marker(view: Widget, conversation: Conversation) -> ContextMarker | None:
    """Draw the line above the first message the model sees (the one line: an older one goes);
    None when the model sees the whole conversation."""
    for old in view.query(ContextMarker):
        old.remove()
    start = window_start(conversation.messages, conversation.context_start)
    marker = marker_for(conversation, start)
    if marker is None:
        return None
    view.mount(marker, before=_turn_at(view, conversation, start))
    return marker


def add_summary(view: Widget, conversation: Conversation, index: int) -> SummaryNote:
    """Show the summary saved at ``conversation.messages[index]`` where it stands: above the
    first message after it (drawn before :func:`place_marker` moves the line below it)."""
    note = SummaryNote(conversation.messages[index].content)
    view.mount(note, before=_turn_at(view, conversation, index + 1))
    return note


# Every user message is one widget of this class (conversation_view.UserTurn), in order; found
# by its class, since conversation_view imports this module.
USER_TURN = ".user-turn"


def _turn_at(view: Widget, conversation: Conversation, index: int) -> object:
    """The widget of the user message at or after ``messages[index]``; None past the last one
    (then mounts go at the end)."""
    messages = conversation.messages
    users_before = sum(1 for m in messages[:index] if m.role == "user")
    turns = list(view.query(USER_TURN))
    return turns[users_before] if users_before < len(turns) else None
