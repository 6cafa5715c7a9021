"""A thinking model's reasoning in the chat: a dimmed block above the answer that streams while
the model reasons and folds to one line when the answer starts ("Thought for 8.1 s, 312
tokens"); a click (or Enter on it) shows it again, or folds it back. The chat's key for all of
them (ChatApp: Ctrl+G) opens or folds every block at once."""

from __future__ import annotations

from textual import events
from textual.widgets import Static

THINKING_LINE = "▸ Thinking… (click to show)"  # folded while it still streams


class ThinkingBlock(Static, can_focus=True):
    DEFAULT_CSS = """
    ThinkingBlock { color: $text-muted; text-style: italic; padding: 0 2; margin: 1 0 0 0; }
    """

    def __init__(self, text: str = "", *, expanded: bool = True) -> None:
        super().__init__("", markup=False, classes="thinking")
        self.text = text  # the reasoning so far
        self.summary: str | None = None  # set when the answer started (or the block was saved)
        self.expanded = expanded
        self._seconds: float | None = None
        self._tokens: int | None = None
        self._show()

    def append(self, text: str) -> None:
        self.text += text
        if self.expanded:
            self.update(self.text)

    def fold(self, seconds: float | None, tokens: int | None, *, keep_open: bool = False) -> None:
        """The answer started: one line instead of the reasoning (``keep_open``: the reasoning
        stays shown, the line is for later)."""
        self._seconds, self._tokens = seconds, tokens
        self.expanded = keep_open
        self._summarize()

    def count(self, tokens: int | None) -> None:
        """The reasoning's exact token count, known when the answer ends."""
        if self.summary is not None and tokens:
            self._tokens = tokens
            self._summarize()

    def _summarize(self) -> None:
        parts = [f"{self._seconds:.1f} s" if self._seconds is not None else None]
        parts.append(f"{self._tokens} tokens" if self._tokens else None)
        said = ", ".join(p for p in parts if p)
        self.summary = f"▸ Thought{' for ' + said if said else ''} (click to show)"
        self._show()

    def set_expanded(self, expanded: bool) -> None:
        self.expanded = expanded
        self._show()

    def toggle(self) -> None:
        self.set_expanded(not self.expanded)

    def _show(self) -> None:
        if self.expanded:
            self.update(self.text)
        else:
            self.update(self.summary if self.summary is not None else THINKING_LINE)

    def on_click(self, event: events.Click) -> None:
        self.toggle()

    def on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            self.toggle()
            event.stop()
