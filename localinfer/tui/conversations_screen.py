"""Modal list of saved conversations, newest first; Enter reopens one, Delete removes it."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from localinfer.conversations import ConversationSummary


def summary_label(s: ConversationSummary) -> str:
    when = s.updated[:16].replace("T", " ")
    turns = "1 turn" if s.turns == 1 else f"{s.turns} turns"
    return f"{when}  {s.title or '(empty)'}  · {turns} · {s.model}"


def unreadable_note(names: list[str], root: Path | None, shown: int = 5) -> str:
    """One line naming the files the list skipped (a damaged file explains a missing chat)."""
    listed = ", ".join(names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    where = f" (in {root})" if root is not None else ""
    if len(names) == 1:
        return f"1 file could not be read and is not listed: {listed}{where}"
    return f"{len(names)} files could not be read and are not listed: {listed}{where}"


class ConversationsScreen(ModalScreen[str | None]):
    """Returns the id of the conversation to open, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        summaries: list[ConversationSummary],
        unreadable: list[str] | None = None,
        root: Path | None = None,
    ) -> None:
        super().__init__()
        self.summaries = summaries
        self.unreadable = unreadable or []
        self.root = root

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
            if self.unreadable:
                yield Label(
                    unreadable_note(self.unreadable, self.root),
                    id="conversations-unreadable",
                    classes="dialog-warning",
                    markup=False,
                )
            yield Label("Enter: open · Esc: cancel", classes="dialog-help")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.summaries[event.option_index].id)

    def action_cancel(self) -> None:
        self.dismiss(None)
