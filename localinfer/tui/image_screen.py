"""The image dialog (F6): the path of an image to attach to the next message. The message being
typed stays in the prompt underneath."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class ImagePathScreen(ModalScreen[str | None]):
    """Returns the path typed, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="image-path", classes="dialog"):
            yield Label("Attach an image to the next message", classes="dialog-title")
            yield Input(placeholder="path of a PNG, JPEG, WebP, GIF or BMP file", id="image-file")
            yield Label(
                "Enter: attach · Esc: cancel · /image clear removes what is attached",
                classes="dialog-help",
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text:
            self.dismiss(text)

    def action_cancel(self) -> None:
        self.dismiss(None)
