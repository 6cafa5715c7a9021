"""Copying from the chat: what can be copied (each answer, and each fenced code block in it) and
the dialog that picks one (F3).

The copy itself is Textual's ``App.copy_to_clipboard``: it writes the terminal's clipboard escape
(OSC 52), which reaches the local clipboard over SSH too (tmux passes it on with
``set -g set-clipboard on``); the app confirms every copy with a notification.
"""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from localinfer.conversations import Conversation

PREVIEW_CHARS = 60


@dataclass(frozen=True, slots=True)
class CodeBlock:
    language: str  # the fence's info word ("" when it names none)
    code: str


@dataclass(frozen=True, slots=True)
class CopyChoice:
    label: str  # the line the dialog shows
    text: str  # what is copied
    what: str  # how the confirmation names it


def code_blocks(markdown: str) -> list[CodeBlock]:
    """The fenced code blocks of ``markdown``, in order (parsed as the view renders it)."""
    tokens = MarkdownIt("gfm-like").parse(markdown)
    return [
        CodeBlock(t.info.split()[0] if t.info.strip() else "", t.content)
        for t in tokens
        if t.type == "fence"
    ]


def _lines(text: str) -> str:
    n = len(text.rstrip("\n").splitlines()) or 1
    return "1 line" if n == 1 else f"{n} lines"


def _preview(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= PREVIEW_CHARS else line[: PREVIEW_CHARS - 1] + "…"


def copy_choices(conversation: Conversation) -> list[CopyChoice]:
    """Everything the dialog offers, newest answer first: its code blocks, then the answer."""
    answers = [m.content for m in conversation.messages if m.role == "assistant"]
    choices: list[CopyChoice] = []
    for number in range(len(answers), 0, -1):
        answer = answers[number - 1]
        for block in code_blocks(answer):
            kind = f"{block.language} code" if block.language else "code"
            lines = _lines(block.code)
            choices.append(
                CopyChoice(
                    f"answer {number} · {kind} · {lines} · {_preview(block.code)}",
                    block.code,
                    f"the {kind} block of answer {number} ({lines})",
                )
            )
        lines = _lines(answer)
        choices.append(
            CopyChoice(
                f"answer {number} · whole answer · {lines} · {_preview(answer)}",
                answer,
                f"answer {number} ({lines})",
            )
        )
    return choices


class CopyScreen(ModalScreen[CopyChoice | None]):
    """Lists the choices (the newest answer's first code block highlighted); Enter copies."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, choices: list[CopyChoice]) -> None:
        super().__init__()
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(id="copy", classes="dialog"):
            yield Label("Copy to the clipboard", classes="dialog-title")
            yield OptionList(
                *[Option(c.label) for c in self.choices], id="copy-options", markup=False
            )
            yield Label("Enter: copy · Esc: cancel", classes="dialog-help")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)
