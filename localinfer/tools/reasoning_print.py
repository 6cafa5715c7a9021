"""A thinking model's reasoning on a terminal: dimmed on stderr as it streams, so stdout holds
the answer alone (pipes and redirects get only the answer), and a line between the two."""

from __future__ import annotations

from typing import TextIO

DIM, RESET = "\x1b[2m", "\x1b[0m"


class ReasoningPrinter:
    """Prints reasoning pieces to ``out`` (dimmed where it is a terminal) until the answer
    starts; ``hidden`` prints nothing."""

    def __init__(self, out: TextIO, hidden: bool = False) -> None:
        self._out = out
        self._hidden = hidden
        self._tty = out.isatty()
        self._open = False  # reasoning printed and not yet closed by the answer

    def reasoning(self, text: str) -> None:
        if not text or self._hidden:
            return
        if not self._open and self._tty:
            self._out.write(DIM)
        self._open = True
        self._out.write(text)
        self._out.flush()

    def answer_starts(self) -> None:
        """Close the reasoning block (once): reset the colour and leave a blank line."""
        if not self._open:
            return
        self._open = False
        self._out.write((RESET if self._tty else "") + "\n\n")
        self._out.flush()
