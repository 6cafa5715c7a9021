"""The export dialog (F8): where to write the conversation's Markdown file. Enter writes it; a
path that already holds a file asks for a second Enter before it is replaced."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class ExportScreen(ModalScreen[Path | None]):
    """Returns the path to write, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._confirmed: Path | None = None  # the existing file a second Enter replaces

    def compose(self) -> ComposeResult:
        with Vertical(id="export", classes="dialog"):
            yield Label("Export the conversation to Markdown", classes="dialog-title")
            yield Input(str(self.path), id="export-path")
            yield Label("", id="export-warning", classes="dialog-warning", markup=False)
            yield Label(
                "Front matter: the model, the settings, each answer's timing figures · "
                "Enter: write · Esc: cancel",
                classes="dialog-help",
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        path = Path(text).expanduser()
        if path.is_dir():
            self._warn(f"{path} is a folder: name a file in it.")
            return
        if path.exists() and path != self._confirmed:
            self._confirmed = path
            self._warn(f"{path} exists: Enter again replaces it.")
            return
        self.dismiss(path)

    def _warn(self, text: str) -> None:
        self.query_one("#export-warning", Label).update(text)

    def action_cancel(self) -> None:
        self.dismiss(None)
