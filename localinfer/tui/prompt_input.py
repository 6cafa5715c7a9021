"""Multi-line prompt: Enter sends, Shift+Enter or Ctrl+J adds a newline, Up/Down walk history."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from localinfer.tui.prompt_history import PromptHistory

NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j"})


class PromptInput(TextArea):
    DEFAULT_CSS = """
    PromptInput { height: auto; max-height: 10; min-height: 3; }
    """

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(
            "", id=id, placeholder=placeholder, soft_wrap=True, show_line_numbers=False
        )
        self.prompt_history = PromptHistory()

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and self.cursor_location[0] == 0:
            entry = self.prompt_history.previous(self.text)
            if entry is not None:
                event.stop()
                event.prevent_default()
                self._show(entry, at_end=False)
                return
        if event.key == "down" and self.cursor_location[0] == self.document.line_count - 1:
            entry = self.prompt_history.next()
            if entry is not None:
                event.stop()
                event.prevent_default()
                self._show(entry, at_end=True)
                return
        await super()._on_key(event)

    def submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.prompt_history.push(text)
        self.clear()
        self.post_message(self.Submitted(text))

    def _show(self, text: str, *, at_end: bool) -> None:
        self.load_text(text)
        if at_end:
            self.move_cursor(self.document.end)
        else:
            self.move_cursor((0, len(self.document[0])))
