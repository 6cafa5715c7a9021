"""Modal settings form. Sampling and thinking apply to the next message; model set-up needs a
reload."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select

from localinfer.tui.settings import (
    BACKENDS,
    CUT_KV_MODES,
    OVERFLOW_POLICIES,
    QUANTS,
    SPECULATIVE_MODES,
    ChatSettings,
)
from localinfer.tui.think_switch import UNKNOWN, ThinkingSupport


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
        context_overflow=form.get("context_overflow", base.context_overflow),
        cut_kv=form.get("cut_kv", base.cut_kv),
        **_thinking(base, form),
    )


def _thinking(base: ChatSettings, form: dict[str, str]) -> dict[str, bool | int | None]:
    """The thinking fields (a form without them keeps ``base``'s); a blank budget: no cap."""
    thinking = form.get("thinking", "on" if base.thinking else "off") == "on"
    raw = form.get("thinking_budget")
    budget = base.thinking_budget
    if raw is not None:
        budget = None if not raw.strip() else _number(raw, int, "thinking budget", 0, 1_000_000)
    return {"thinking": thinking, "thinking_budget": budget}


def thinking_help(support: ThinkingSupport) -> str:
    """What the thinking settings do with the model loaded now."""
    if support.thinks is None:
        return (
            "Thinking: sent with each message; the server's model applies it if it thinks. "
            "Blank budget: no cap."
        )
    if not support.thinks:
        return "Thinking: this model does not think, so these two settings do nothing for it."
    return (
        "Thinking: this model reasons before it answers. Off, or at most the budget's tokens of "
        "reasoning, from the next message; blank budget: no cap. /think and /no_think in a "
        "message set it for that message."
    )


OVERFLOW_HELP = (
    "Past the context: drop-oldest leaves out the oldest whole turns (a line marks where the "
    "model's context begins), summarize also has the model summarize them, stop refuses. KV "
    "after a cut: shift reuses the kept turns' cache (fast, approximate), prefill computes it "
    "again (exact)."
)


def _choice(widget_id: str, options: Iterable[str], value: str) -> Select[str]:
    """A compact drop-down whose labels are its values."""
    return Select(
        [(o, o) for o in options], value=value, id=widget_id, allow_blank=False, compact=True
    )


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Returns the new settings, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings, support: ThinkingSupport = UNKNOWN) -> None:
        super().__init__()
        self.settings = settings
        self.support = support  # the loaded model's thinking: the two fields say what they do

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
                yield from self._thinking_fields()
                yield Label("past the context")
                yield _choice("context_overflow", OVERFLOW_POLICIES, s.context_overflow)
                yield Label("KV after a cut (reload)")
                yield _choice("cut_kv", CUT_KV_MODES, s.cut_kv)
            yield Label(thinking_help(self.support), id="thinking-help", classes="dialog-help")
            yield Label(OVERFLOW_HELP, id="overflow-help", classes="dialog-help")
            yield Label("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Cancel", id="cancel")

    def _thinking_fields(self) -> ComposeResult:
        s, idle = self.settings, self.support.thinks is False  # nothing to set on this model
        yield Label("thinking")
        thinking = _choice("thinking", ("on", "off"), "on" if s.thinking else "off")
        thinking.disabled = idle
        yield thinking
        yield Label("thinking budget (tokens)")
        budget = "" if s.thinking_budget is None else str(s.thinking_budget)
        yield Input(budget, id="thinking_budget", placeholder="no cap", compact=True, disabled=idle)

    def form(self) -> dict[str, str]:
        values: dict[str, str] = {}
        names = ("temperature", "top_p", "max_tokens", "ctx", "slots", "draft", "thinking_budget")
        for name in names:
            values[name] = self.query_one(f"#{name}", Input).value
        for name in ("quant", "speculative", "backend", "thinking", "context_overflow", "cut_kv"):
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
