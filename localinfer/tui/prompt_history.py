"""Shell-style history of sent prompts for the chat input (Up/Down), without any UI."""

from __future__ import annotations


class PromptHistory:
    """Older entries with :meth:`previous`, newer with :meth:`next`; the unsent draft is kept."""

    def __init__(self, limit: int = 200) -> None:
        self._entries: list[str] = []
        self._limit = limit
        self._index: int | None = None  # None: editing the draft, not browsing
        self._draft = ""

    @property
    def entries(self) -> list[str]:
        return list(self._entries)

    def push(self, text: str) -> None:
        self._index = None
        self._draft = ""
        if not text.strip() or (self._entries and self._entries[-1] == text):
            return
        self._entries.append(text)
        del self._entries[: -self._limit]

    def previous(self, current: str) -> str | None:
        """The entry before the one shown (None when there is none); ``current`` is the draft."""
        if not self._entries:
            return None
        if self._index is None:
            self._draft = current
            self._index = len(self._entries)
        if self._index == 0:
            return None
        self._index -= 1
        return self._entries[self._index]

    def next(self) -> str | None:
        """The entry after the one shown; the saved draft past the newest; None if not browsing."""
        if self._index is None:
            return None
        self._index += 1
        if self._index >= len(self._entries):
            self._index = None
            return self._draft
        return self._entries[self._index]
