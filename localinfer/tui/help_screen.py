"""The chat's help (F1, or ? when the prompt is not focused): every key, in one list. The
README's chat section has the same table (a test holds them, and the app's bindings, together)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

# (keys, what they do), in the order the help lists them.
CHAT_KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the message"),
    ("Shift+Enter, Ctrl+J", "a new line in the message"),
    ("↑ / ↓", "your earlier / later messages (at the prompt's first / last line)"),
    ("Esc", "stop the answer"),
    ("F5", "regenerate the last answer (a new branch; the old one stays saved)"),
    ("F2", "edit one of your messages and resend it (a new branch; the old one stays saved)"),
    ("Ctrl+R", "copy the last answer (terminal clipboard, OSC 52)"),
    ("F3", "copy an answer or one of its code blocks"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+O", "open a saved conversation"),
    ("Ctrl+F", "search the saved conversations"),
    ("F8", "export the conversation to Markdown (model, settings, timings as front matter)"),
    ("Ctrl+T", "edit the system prompt"),
    ("F4", "system-prompt presets: use, save the current one, delete"),
    ("F6", "attach an image to the next message (or type /image PATH; /image clear removes)"),
    ("Ctrl+S", "settings (sampling, context, backend, thinking)"),
    ("Ctrl+L", "pick and load a model"),
    ("Ctrl+G", "show or fold every reasoning block (thinking models)"),
    ("F1, ?", "this help (? when the prompt is not focused)"),
    ("Ctrl+P", "command palette"),
    ("Ctrl+Q", "quit (an answer still streaming is stopped and saved first)"),
)

KEY_NAMES = {"escape": "Esc", "question_mark": "?", "enter": "Enter"}


def key_name(key: str) -> str:
    """A binding's key as the help writes it: ``ctrl+r`` -> ``Ctrl+R``, ``f5`` -> ``F5``."""
    if key in KEY_NAMES:
        return KEY_NAMES[key]
    return "+".join(part.capitalize() if len(part) > 1 else part.upper() for part in key.split("+"))


def help_text(width: int = 22) -> str:
    return "\n".join(f"{keys:<{width}}{what}" for keys, what in CHAT_KEYS)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("f1", "close", "Close", show=False),
        Binding("question_mark", "close", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="help", classes="dialog"):
            yield Label("Keys", classes="dialog-title")
            yield Static(help_text(), id="help-keys", markup=False)
            yield Label(
                "Dialogs: Enter chooses · Esc closes · Ctrl+S saves where there is a form",
                classes="dialog-help",
            )

    def action_close(self) -> None:
        self.dismiss(None)
