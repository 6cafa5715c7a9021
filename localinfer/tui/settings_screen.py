"""Modal settings form. Sampling applies to the next message; model set-up needs a reload."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select

from localinfer.tui.settings import BACKENDS, QUANTS, SPECULATIVE_MODES, ChatSettings


class SettingsError(ValueError):
    pass


def _number(raw: str, kind: type, name: str, low: float, high: float) -> float | int:
    try:
        value = kind(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}: '{raw}' is not a {kind.__name__}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low:g} and {high:g}")
    return value


def parse_settings(base: ChatSettings, form: dict[str, str]) -> ChatSettings:
    """Build settings from the form's raw strings; SettingsError says which field is wrong."""
    speculative = form["speculative"]
    draft = form["draft"].strip() or None
    if speculative == "draft" and not draft:
        raise SettingsError("speculative mode 'draft' needs a draft model name")
    return base.changed(
        temperature=_number(form["temperature"], float, "temperature", 0.0, 5.0),
        top_p=_number(form["top_p"], float, "top_p", 0.01, 1.0),
        max_tokens=_number(form["max_tokens"], int, "max tokens", 1, 1_000_000),
        ctx=_number(form["ctx"], int, "context", 64, 10_000_000),
        slots=_number(form["slots"], int, "slots", 1, 64),
        quant=None if form["quant"] == "file" else form["quant"],
        backend=None if form["backend"] == "auto" else form["backend"],
        speculative=speculative,
        draft=draft,
    )


def _choice(widget_id: str, options: Iterable[str], value: str) -> Select[str]:
    """A compact drop-down whose labels are its values."""
    return Select(
        [(o, o) for o in options], value=value, id=widget_id, allow_blank=False, compact=True
    )


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Returns the new settings, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(id="settings", classes="dialog"):
            yield Label("Settings", classes="dialog-title")
            with Grid(id="settings-grid"):
                yield Label("temperature")
                yield Input(f"{s.temperature:g}", id="temperature", compact=True)
                yield Label("top_p")
                yield Input(f"{s.top_p:g}", id="top_p", compact=True)
                yield Label("max tokens")
                yield Input(str(s.max_tokens), id="max_tokens", compact=True)
                yield Label("context (reload)")
                yield Input(str(s.ctx), id="ctx", compact=True)
                yield Label("slots (reload)")
                yield Input(str(s.slots), id="slots", compact=True)
                yield Label("quantization (reload)")
                yield _choice("quant", QUANTS, s.quant or "file")
                yield Label("speculative (reload)")
                yield _choice("speculative", SPECULATIVE_MODES, s.speculative)
                yield Label("draft model (reload)")
                yield Input(
                    s.draft or "", id="draft", placeholder="for speculative = draft", compact=True
                )
                yield Label("backend (reload)")
                yield _choice("backend", BACKENDS, s.backend or "auto")
            yield Label("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Cancel", id="cancel")

    def form(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for name in ("temperature", "top_p", "max_tokens", "ctx", "slots", "draft"):
            values[name] = self.query_one(f"#{name}", Input).value
        for name in ("quant", "speculative", "backend"):
            values[name] = str(self.query_one(f"#{name}", Select).value)
        return values

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_apply()

    def action_apply(self) -> None:
        try:
            settings = parse_settings(self.settings, self.form())
        except SettingsError as exc:
            self.query_one("#settings-error", Label).update(str(exc))
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)
