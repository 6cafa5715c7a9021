"""A thinking model's reasoning in the chat: a dimmed block above the answer that streams while
the model reasons and folds to one line when the answer starts ("Thought for 8.1 s, 312
tokens"); a click (or Enter on it) shows it again, or folds it back."""

from __future__ import annotations

from textual import events
from textual.widgets import Static


class ThinkingBlock(Static, can_focus=True):
    DEFAULT_CSS = """
    ThinkingBlock { color: $text-muted; text-style: italic; padding: 0 2; margin: 1 0 0 0; }
    """

    def __init__(self) -> None:
        super().__init__("", markup=False, classes="thinking")
        self.text = ""  # the reasoning so far
        self.summary: str | None = None  # set when folded
        self.expanded = True

    def append(self, text: str) -> None:
        self.text += text
        if self.expanded:
            self.update(self.text)

    def fold(self, seconds: float | None, tokens: int | None) -> None:
        """The answer started: one line instead of the reasoning."""
        parts = [f"{seconds:.1f} s" if seconds is not None else None]
        parts.append(f"{tokens} tokens" if tokens else None)
        said = ", ".join(p for p in parts if p)
        self.summary = f"▸ Thought{' for ' + said if said else ''} (click to show)"
        self.expanded = False
        self.update(self.summary)

    def toggle(self) -> None:
        if self.summary is None:
            return
        self.expanded = not self.expanded
        self.update(self.text if self.expanded else self.summary)

    def on_click(self, event: events.Click) -> None:
        self.toggle()

    def on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            self.toggle()
            event.stop()
