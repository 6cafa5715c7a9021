"""The system-prompt presets dialog (F4): Enter on a preset makes it the conversation's system
prompt; a name and Enter saves the current system prompt under it; Delete removes the
highlighted preset."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from localinfer.tui.presets import PresetError, PresetStore

PREVIEW_CHARS = 70


def preset_label(name: str, prompt: str) -> str:
    flat = " ".join(prompt.split()) or "(empty: no system prompt)"
    if len(flat) > PREVIEW_CHARS:
        flat = flat[: PREVIEW_CHARS - 1] + "…"
    return f"{name}  · {flat}"


class PresetsScreen(ModalScreen[str | None]):
    """Returns the system prompt to use, or None (cancelled, or only saved/deleted)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("delete", "delete", "Delete")]

    def __init__(self, store: PresetStore, current: str) -> None:
        super().__init__()
        self.store = store
        self.current = current
        self.names: list[str] = []
        self.presets: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="presets", classes="dialog"):
            yield Label("System-prompt presets", classes="dialog-title")
            yield OptionList(id="preset-options", markup=False)
            yield Label("", id="presets-message", classes="dialog-warning", markup=False)
            yield Label("Save the current system prompt as:", classes="dialog-help")
            yield Input(placeholder="preset name", id="preset-name")
            yield Label(
                "Enter on a preset: use it · Delete: remove it · Esc: close · "
                f"kept in {self.store.path}",
                classes="dialog-help",
                markup=False,
            )

    def on_mount(self) -> None:
        try:
            self._show(self.store.load())
        except PresetError as exc:
            self._say(str(exc))
        if self.names:
            self.query_one("#preset-options", OptionList).focus()
        else:
            self.query_one("#preset-name", Input).focus()

    def _show(self, presets: dict[str, str]) -> None:
        self.presets, self.names = presets, list(presets)
        options = self.query_one("#preset-options", OptionList)
        options.clear_options()
        options.add_options([Option(preset_label(n, p)) for n, p in presets.items()])
        if presets:
            options.highlighted = 0
        else:
            self._say("No presets yet: name the current system prompt below to save it.")

    def _say(self, text: str) -> None:
        self.query_one("#presets-message", Label).update(text)

    @on(OptionList.OptionSelected, "#preset-options")
    def on_preset_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.presets[self.names[event.option_index]])

    @on(Input.Submitted, "#preset-name")
    def on_name_submitted(self, event: Input.Submitted) -> None:
        try:
            self._show(self.store.save(event.value, self.current))
        except (PresetError, OSError) as exc:
            self._say(str(exc))
            return
        self._say(f"Saved the current system prompt as {' '.join(event.value.split())!r}.")
        event.input.clear()

    def action_delete(self) -> None:
        options = self.query_one("#preset-options", OptionList)
        if not options.has_focus or options.highlighted is None or not self.names:
            return
        name = self.names[options.highlighted]
        try:
            self._show(self.store.delete(name))
        except (PresetError, OSError) as exc:
            self._say(str(exc))
            return
        self._say(f"Deleted {name!r}.")

    def action_cancel(self) -> None:
        self.dismiss(None)
