"""Modal list of models (embedded, catalog, local files) marked with whether each fits."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from localinfer.tui.host import ModelChoice
from localinfer.tui.memory_bar import human_bytes


def choice_label(choice: ModelChoice) -> Text:
    if choice.fits is True:
        mark = Text("✔ fits   ", style="green")
    elif choice.fits is False:
        mark = Text("✘ too big", style="red")
    else:
        mark = Text("? unknown", style="yellow")
    text = Text.assemble(mark, " ", (f"{choice.name:<28}", "bold" if choice.current else ""))
    text.append(f" {choice.source:<8} {human_bytes(choice.size_bytes):>10}")
    if choice.current:
        text.append("  (loaded)", style="dim")
    if choice.note:
        text.append(f"  {choice.note[:36]}", style="dim")
    return text


class ModelPickerScreen(ModalScreen[str | None]):
    """Returns the chosen model's name, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, choices: list[ModelChoice], ctx: int) -> None:
        super().__init__()
        self.choices = choices
        self.ctx = ctx

    def compose(self) -> ComposeResult:
        with Vertical(id="picker", classes="dialog"):
            yield Label(f"Pick a model (fit checked at context {self.ctx})", classes="dialog-title")
            options = [Option(choice_label(c), id=c.name) for c in self.choices]
            yield OptionList(*options, id="model-options")
            yield Label("Enter: load · Esc: cancel", classes="dialog-help")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
