"""The edit dialog (F2): pick one of your messages (the last is picked to start with), change
it, and Ctrl+S resends it. The chat then branches (branching.py): the conversation as it was
stays saved, and the new one goes on from the edited message."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, TextArea
from textual.widgets.option_list import Option

PREVIEW_CHARS = 90


@dataclass(frozen=True, slots=True)
class Edit:
    index: int  # the message's index in Conversation.messages
    text: str  # what to send instead


def question_label(number: int, text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > PREVIEW_CHARS:
        flat = flat[: PREVIEW_CHARS - 1] + "…"
    return f"{number}. {flat}"


class EditScreen(ModalScreen[Edit | None]):
    """``questions``: (index in the conversation, text) of each user message, oldest first."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "resend", "Resend")]

    def __init__(self, questions: list[tuple[int, str]]) -> None:
        super().__init__()
        self.questions = questions

    def compose(self) -> ComposeResult:
        with Vertical(id="edit", classes="dialog"):
            yield Label("Edit a message and resend it (a new branch)", classes="dialog-title")
            yield OptionList(
                *[Option(question_label(n, t)) for n, (_, t) in enumerate(self.questions, 1)],
                id="edit-options",
                markup=False,
            )
            yield TextArea(self.questions[-1][1], id="edit-text", soft_wrap=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Resend", id="resend", variant="primary")
                yield Button("Cancel", id="cancel")
            yield Label(
                "↑/↓ in the list: pick · Ctrl+S: resend · Esc: cancel · the conversation as it "
                "was stays saved (Ctrl+O)",
                classes="dialog-help",
            )

    def on_mount(self) -> None:
        options = self.query_one("#edit-options", OptionList)
        options.highlighted = len(self.questions) - 1
        text = self.query_one("#edit-text", TextArea)
        text.focus()
        text.move_cursor(text.document.end)

    @on(OptionList.OptionHighlighted, "#edit-options")
    def on_question_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        text = self.query_one("#edit-text", TextArea)
        wanted = self.questions[event.option_index][1]
        if text.text != wanted:
            text.load_text(wanted)

    @on(OptionList.OptionSelected, "#edit-options")
    def on_question_selected(self) -> None:
        self.query_one("#edit-text", TextArea).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "resend":
            self.action_resend()
        else:
            self.action_cancel()

    def action_resend(self) -> None:
        options = self.query_one("#edit-options", OptionList)
        text = self.query_one("#edit-text", TextArea).text.strip()
        if not text:
            self.notify("Not sent: the message is empty.", severity="warning")
            return
        at = options.highlighted if options.highlighted is not None else len(self.questions) - 1
        self.dismiss(Edit(self.questions[at][0], text))

    def action_cancel(self) -> None:
        self.dismiss(None)
