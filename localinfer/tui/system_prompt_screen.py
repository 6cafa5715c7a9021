"""Modal editor for the conversation's system prompt."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, TextArea


class SystemPromptScreen(ModalScreen[str | None]):
    """Returns the new system prompt (may be empty), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(id="system-prompt", classes="dialog"):
            yield Label("System prompt (applies to the next message)", classes="dialog-title")
            yield TextArea(self.text, id="system-text", soft_wrap=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        self.dismiss(self.query_one("#system-text", TextArea).text.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
