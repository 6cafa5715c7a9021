"""What every part of the chat app shares: its state, its main widgets, the status line and
the memory bar. The parts (answering, conversation_actions, model_actions) build on this base,
and ``ChatApp`` (app.py) puts them together with the layout and the keys.

Threading rule: every blocking call runs in a ``@work(thread=True)`` worker that only posts
messages (localinfer/tui/messages.py); handlers run on the UI thread and are the only code that
touches widgets.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

from textual import on, work
from textual.app import App
from textual.widgets import Static

from localinfer.conversations import Conversation, ConversationStore, MessageImage
from localinfer.tui.answer_source import ChatBackend
from localinfer.tui.conversation_view import AnswerTurn, ConversationView, UserTurn
from localinfer.tui.heap_trim import trim_heap
from localinfer.tui.load_spinner import LoadSpinner
from localinfer.tui.memory_bar import MemoryBar
from localinfer.tui.messages import MemoryMeasured
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.render_pace import RenderPace
from localinfer.tui.stats_panel import StatsPanel

READY_PLACEHOLDER = "Ask anything · Enter sends · Shift+Enter/Ctrl+J newline · Esc stops"
LOADING_PLACEHOLDER = "Loading the model… you can start typing"


class ChatAppBase(App[None]):
    # The main screen's widgets, made by ChatApp.compose. Handlers keep these references: a
    # worker's message may arrive while a dialog is the active screen, where a query would not
    # find them.
    view: ConversationView
    prompt: PromptInput
    stats: StatsPanel
    memory_bar: MemoryBar
    status: Static
    spinner: LoadSpinner
    settings_summary: Static
    pending_row: Static  # the images attached to the next message (image_actions.py)

    def __init__(
        self,
        host: ChatBackend,
        store: ConversationStore | None = None,
        conversation: Conversation | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.host = host
        self.store = store if store is not None else ConversationStore()
        self.conversation = conversation or Conversation()
        self.clock = clock
        self.render_pace = RenderPace()  # how often a streaming answer's text is shown
        self.answering = False
        self.loading = False
        self._request_id: str | None = None
        self._thinking_since: float | None = None  # when this answer's reasoning began
        self._stop = threading.Event()
        self._answer: AnswerTurn | None = None
        self._question: UserTurn | None = None  # the turn being answered, as shown
        self._last_answer_text = ""
        self._quit_pending = False  # quit asked mid-answer: quit once the answer has ended
        self._quitting = False
        # Reasoning blocks (a thinking model's): all shown (the key, Ctrl+G), or each folded to
        # a line once its answer starts; the key is in the footer where it does something.
        self.reasoning_shown = False
        self.thinking_key_shown = False
        self.pending_images: list[MessageImage] = []  # attached to the next message

    # -- status --------------------------------------------------------------------------------

    def _set_status(self, text: str, *, busy: bool = False) -> None:
        self.status.update(text)
        if busy:
            self.spinner.start()
        else:
            self.spinner.stop()

    def _idle_status(self) -> str:
        return f"Ready · {self.host.describe()}" if self.host.loaded else "No model"

    def _set_ready(self, description: str, notice: str | None) -> None:
        self.loading = False
        self.sub_title = description
        self._set_status(f"Ready · {description}")
        self.prompt.placeholder = READY_PLACEHOLDER
        self.settings_summary.update(self.host.settings.describe())
        if notice:
            self.view.add_notice(notice)
        self.refresh_thinking_key()
        # What is alive now (the model, its tokenizer, the window) lives as long as the model:
        # out of the cyclic collector's sight, its passes, which stop every thread (the engine's
        # too), scan only what answers allocate. A reload thaws it first (ModelActions).
        gc.freeze()

    def refresh_thinking_key(self) -> None:
        """List the reasoning key in the footer while the model thinks or the conversation holds
        reasoning (a model that never thinks keeps the footer it had)."""
        wanted = bool(self.view.thinking_blocks())
        if not wanted and self.host.loaded:
            try:
                wanted = self.host.thinking_support().thinks is True
            except Exception:  # noqa: BLE001 - a model that cannot say is treated as not thinking
                wanted = False
        if wanted != self.thinking_key_shown:
            self.thinking_key_shown = wanted
            self.refresh_bindings()

    # -- memory bar ----------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="memory")
    def refresh_memory(self) -> None:
        trim_heap()  # after an answer: what it freed goes back to the system (heap_trim.py)
        try:
            figures = self.host.memory()
        except Exception:  # noqa: BLE001 - the bar simply keeps its last figures
            return
        self.post_message(MemoryMeasured(figures))

    @on(MemoryMeasured)
    def on_memory_measured(self, message: MemoryMeasured) -> None:
        self.memory_bar.show(message.figures)
