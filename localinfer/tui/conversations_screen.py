"""Modal list of saved conversations, newest first; Enter reopens one, Delete removes it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from localinfer.conversations import ConversationSummary


def summary_label(s: ConversationSummary) -> str:
    when = s.updated[:16].replace("T", " ")
    return f"{when}  {s.title or '(empty)'}  · {s.turns} turns · {s.model}"


class ConversationsScreen(ModalScreen[str | None]):
    """Returns the id of the conversation to open, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, summaries: list[ConversationSummary]) -> None:
        super().__init__()
        self.summaries = summaries

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations", classes="dialog"):
            yield Label("Saved conversations", classes="dialog-title")
            if self.summaries:
                # Options carry no id: what a saved file says must not become a widget id
                # (duplicates raised DuplicateID) nor markup; the index finds the summary.
                yield OptionList(
                    *[Option(summary_label(s)) for s in self.summaries],
                    id="conversation-options",
                    markup=False,
                )
            else:
                yield Label("Nothing saved yet: conversations save after each answer.")
            yield Label("Enter: open · Esc: cancel", classes="dialog-help")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.summaries[event.option_index].id)

    def action_cancel(self) -> None:
        self.dismiss(None)
