"""`localinfer chat`: the Textual app. It renders; the host answers; workers carry the waiting.

``ChatApp`` is the layout and the keys; what the keys do lives in its parts: answering.py
(send, stream, stop), conversation_actions.py (new, open, system prompt, copy, save),
thinking_actions.py (a thinking model's reasoning key and /think, /no_think),
model_actions.py (settings, model picker, loading), image_actions.py (attaching an image: F6,
/image) and chat_features.py (regenerate, edit and resend, copy, search, export, presets, help;
help_screen.py lists every key). app_base.py holds the state they share and the threading rule
they follow.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Label, Static
from textual.worker import Worker

from localinfer.tui.app_base import LOADING_PLACEHOLDER
from localinfer.tui.chat_features import ChatFeatures
from localinfer.tui.conversation_view import ConversationView
from localinfer.tui.load_spinner import LoadSpinner
from localinfer.tui.memory_bar import MemoryBar
from localinfer.tui.model_actions import ModelActions
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.stats_panel import StatsPanel

# How long quitting waits for the conversation to be saved and its KV kept (the session's close
# writes the tiers to disk after that).
QUIT_KV_WAIT_S = 5.0
# How long quitting mid-answer waits for the stopped answer to end (an engine that never answers
# the abort must not hold the terminal).
QUIT_ANSWER_WAIT_S = 5.0

# The narrowest terminal that shows the figures panel beside the conversation.
NARROW_COLUMNS = 84

CHAT_ACTIONS = frozenset(
    {
        "stop",
        "new_conversation",
        "open_conversation",
        "pick_model",
        "settings",
        "system_prompt",
        "copy_answer",
        "toggle_thinking",
        "help",
        "regenerate",
        "edit_message",
        "copy_choice",
        "search",
        "export",
        "presets",
        "attach_image",
    }
)


class ChatApp(ChatFeatures, ModelActions):
    CSS_PATH = Path(__file__).with_name("chat.tcss")  # absolute: subclasses live elsewhere
    TITLE = "localinfer chat"
    # Below NARROW_COLUMNS the figures panel (44 columns) is hidden: beside it the prompt had no
    # width left, and Textual raised wrapping its placeholder into zero columns (chat.tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_COLUMNS, "-wide")]

    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("ctrl+o", "open_conversation", "Open", priority=True),
        Binding("ctrl+l", "pick_model", "Model", priority=True),
        Binding("ctrl+s", "settings", "Settings", priority=True),
        Binding("ctrl+t", "system_prompt", "System", priority=True),
        Binding("ctrl+r", "copy_answer", "Copy answer", priority=True),
        # Listed (and live) only where there is reasoning to show (refresh_thinking_key).
        Binding("ctrl+g", "toggle_thinking", "Thinking", priority=True),
        # The rest are listed by the help (F1), not in the footer, which has no room for them.
        # F-keys and Ctrl+F: the Ctrl letters left are the prompt's editing keys or the
        # terminal's (Ctrl+Z, Ctrl+C, tmux's Ctrl+B).
        Binding("f1", "help", "Help", priority=True),
        Binding("question_mark", "help", "Help", show=False),  # the prompt types a ? instead
        Binding("f5", "regenerate", "Regenerate", show=False, priority=True),
        Binding("f2", "edit_message", "Edit", show=False, priority=True),
        Binding("f3", "copy_choice", "Copy…", show=False, priority=True),
        Binding("ctrl+f", "search", "Search", show=False, priority=True),
        Binding("f8", "export", "Export", show=False, priority=True),
        Binding("f4", "presets", "Presets", show=False, priority=True),
        Binding("f6", "attach_image", "Image", show=False, priority=True),
    ]

    def compose(self) -> ComposeResult:
        self.view = ConversationView(id="conversation")
        self.prompt = PromptInput(placeholder=LOADING_PLACEHOLDER, id="prompt")
        self.stats = StatsPanel(id="stats")
        self.memory_bar = MemoryBar(id="memory")
        self.status = Static("", id="status", markup=False)
        self.pending_row = Static("", id="pending-images", markup=False)
        self.spinner = LoadSpinner(id="load-progress")
        self.settings_summary = Static(
            self.host.settings.describe(), id="settings-summary", markup=False
        )
        yield Header()
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield self.view
                with Horizontal(id="status-row"):
                    yield self.status
                    yield self.spinner
                yield self.pending_row
                yield self.prompt
            with Vertical(id="side"):
                yield Label("Answer", classes="side-title")
                yield self.stats
                yield Label("Memory", classes="side-title")
                yield self.memory_bar
                yield Label("Settings", classes="side-title")
                yield self.settings_summary
        yield Footer()

    def on_mount(self) -> None:
        self.prompt.focus()
        # A model preloading for this window waits for its first paint (host.load_in_background).
        self.call_after_refresh(self.host.ui_started.set)
        if self.conversation.messages:
            self.show_saved(self.conversation)
            self.refresh_thinking_key()
        if self.host.loaded:
            self._set_ready(self.host.describe(), self.host.notice())
            self.refresh_memory()
        else:
            self._start_load(self.host.settings)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The chat's keys belong to the main screen; in a dialog they fall through to it
        # (Esc cancels the dialog there instead of stopping an answer).
        if action == "toggle_thinking" and not self.thinking_key_shown:
            return False
        return not (action in CHAT_ACTIONS and len(self.screen_stack) > 1)

    async def action_quit(self) -> None:
        if self.answering and self._request_id is not None:
            # Mid-answer, quitting stops the answer first: the part that streamed ends as a
            # stopped answer and is saved (on_answer_finished calls this again once it has).
            # Exiting at once lost the turn, and the late end mounted into a closing view.
            if not self._quit_pending:
                self._quit_pending = True
                self.action_stop()
                self.set_timer(QUIT_ANSWER_WAIT_S, self._quit_now)
            return
        await self._quit_now()

    async def _quit_now(self) -> None:
        if self._quitting:
            return
        self._quitting = True
        self._request_id = None  # a late answer event finds nothing to update while we close
        self.keep_conversation_kv()
        pending = [w for w in self.workers if w.group in ("save", "persist-kv")]
        if pending:
            # Bounded: a slow disk costs the next open a prefill, never a hung quit.
            await asyncio.wait(
                [asyncio.ensure_future(_finished(w)) for w in pending], timeout=QUIT_KV_WAIT_S
            )
        self.exit()


async def _finished(worker: Worker[object]) -> None:
    with contextlib.suppress(Exception):
        await worker.wait()
