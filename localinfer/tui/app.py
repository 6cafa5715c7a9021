"""`localinfer chat`: the Textual app. It renders; the host answers; workers carry the waiting.

Threading rule: every blocking call (load a model, tokenize + stream an answer, list models or
conversations) runs in a ``@work(thread=True)`` worker that only posts messages
(localinfer/tui/messages.py); the handlers below run on the UI thread and are the only code that
touches widgets.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Label, Static

from localinfer.conversations import Conversation, ConversationError, ConversationStore
from localinfer.engine.types import Request
from localinfer.errors import (
    LocalinferError,
    ModelFileError,
    OutOfMemoryBudgetError,
    UnknownModelError,
)
from localinfer.tui.conversation_view import AnswerTurn, ConversationView
from localinfer.tui.conversations_screen import ConversationsScreen
from localinfer.tui.host import ChatHost
from localinfer.tui.live_stats import LiveStats, StatsSnapshot
from localinfer.tui.load_spinner import LoadSpinner
from localinfer.tui.memory_bar import MemoryBar
from localinfer.tui.messages import (
    AnswerFinished,
    AnswerProgressed,
    AnswerRejected,
    ConversationsListed,
    MemoryMeasured,
    ModelChoicesReady,
    ModelLoaded,
    ModelLoadFailed,
)
from localinfer.tui.model_picker import ModelPickerScreen
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from localinfer.tui.settings_screen import SettingsScreen
from localinfer.tui.stats_panel import StatsPanel
from localinfer.tui.stream_pump import pump_answer
from localinfer.tui.system_prompt_screen import SystemPromptScreen

READY_PLACEHOLDER = "Ask anything · Enter sends · Shift+Enter/Ctrl+J newline · Esc stops"
LOADING_PLACEHOLDER = "Loading the model… you can start typing"


CHAT_ACTIONS = frozenset(
    {
        "stop",
        "new_conversation",
        "open_conversation",
        "pick_model",
        "settings",
        "system_prompt",
        "copy_answer",
    }
)


def _load_hint(exc: BaseException) -> str:
    """What to do next after a failed model load."""
    if isinstance(exc, OutOfMemoryBudgetError):
        return "pick a smaller model (Ctrl+L) or lower the context, slots or quantization (Ctrl+S)"
    if isinstance(exc, (UnknownModelError, ModelFileError)):
        return "pick another model (Ctrl+L)"
    return "pick another model (Ctrl+L) or change the backend or quantization (Ctrl+S)"


def _error_text(exc: BaseException) -> str:
    """One clause, without a final full stop (the UI adds what to do next after it)."""
    if isinstance(exc, LocalinferError):
        return str(exc).rstrip(". ")
    return f"unexpected {type(exc).__name__}: {exc}".rstrip(". ")


class ChatApp(App[None]):
    CSS_PATH = Path(__file__).with_name("chat.tcss")  # absolute: subclasses live elsewhere
    TITLE = "localinfer chat"

    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("ctrl+o", "open_conversation", "Open", priority=True),
        Binding("ctrl+l", "pick_model", "Model", priority=True),
        Binding("ctrl+s", "settings", "Settings", priority=True),
        Binding("ctrl+t", "system_prompt", "System", priority=True),
        Binding("ctrl+r", "copy_answer", "Copy answer", priority=True),
    ]

    def __init__(
        self,
        host: ChatHost,
        store: ConversationStore | None = None,
        conversation: Conversation | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.host = host
        self.store = store if store is not None else ConversationStore()
        self.conversation = conversation or Conversation()
        self.clock = clock
        self.answering = False
        self.loading = False
        self._request_id: str | None = None
        self._stop = threading.Event()
        self._answer: AnswerTurn | None = None
        self._last_answer_text = ""

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Handlers keep references to the main screen's widgets: a worker's message may arrive
        # while a dialog is the active screen, where a query would not find them.
        self.view = ConversationView(id="conversation")
        self.prompt = PromptInput(placeholder=LOADING_PLACEHOLDER, id="prompt")
        self.stats = StatsPanel(id="stats")
        self.memory_bar = MemoryBar(id="memory")
        self.status = Static("", id="status", markup=False)
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
        if self.conversation.messages:
            self.view.show_conversation(self.conversation)
        if self.host.loaded:
            self._set_ready(self.host.describe(), getattr(self.host.session, "runner_notice", None))
            self.refresh_memory()
        else:
            self._start_load(self.host.settings)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The chat's keys belong to the main screen; in a dialog they fall through to it
        # (Esc cancels the dialog there instead of stopping an answer).
        return not (action in CHAT_ACTIONS and len(self.screen_stack) > 1)

    # -- status --------------------------------------------------------------------------------

    def _set_status(self, text: str, *, busy: bool = False) -> None:
        self.status.update(text)
        if busy:
            self.spinner.start()
        else:
            self.spinner.stop()

    def _set_ready(self, description: str, notice: str | None) -> None:
        self.loading = False
        self.sub_title = description
        self._set_status(f"Ready · {description}")
        self.prompt.placeholder = READY_PLACEHOLDER
        self.settings_summary.update(self.host.settings.describe())
        if notice:
            self.view.add_notice(notice)

    # -- sending and streaming ----------------------------------------------------------------

    @on(PromptInput.Submitted)
    def on_prompt_submitted(self, event: PromptInput.Submitted) -> None:
        if self.answering or self.loading or not self.host.loaded:
            self.prompt.load_text(event.text)  # keep what was typed
            why = "an answer is still streaming (Esc stops it)"
            if not self.answering:
                why = "the model is still loading"
            self.notify(f"Not sent: {why}.", severity="warning")
            return
        self.send(event.text)

    def send(self, text: str) -> None:
        self.conversation.model = self.host.session.model.name
        self.conversation.add("user", text)
        self.view.add_user(text)
        self._answer = self.view.start_answer()
        self._request_id = f"chat-{uuid.uuid4().hex[:12]}"
        self._stop.clear()
        self.answering = True
        self._set_status("Answering… (Esc stops)")
        self.stats.show_answer(StatsSnapshot(running=True))
        params = self.host.settings.sampling_params()
        self.run_answer(self.conversation.prompt_messages(), Request([], params, self._request_id))

    @work(thread=True, exclusive=True, group="answer")
    def run_answer(self, messages: list[dict[str, str]], request: Request) -> None:
        stats = LiveStats(clock=self.clock)
        try:
            request.prompt_ids = self.host.prompt_ids(messages)
            stats.start(len(request.prompt_ids))
            handle = self.host.submit(request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the UI
            self.post_message(AnswerRejected(_error_text(exc)))
            return
        if self._stop.is_set():
            self.host.abort(request.request_id)
        try:
            final = pump_answer(
                request.request_id,
                handle,
                stats,
                lambda progress: self.post_message(AnswerProgressed(progress)),
                self.host.engine_metrics,
                self.clock,
            )
        except Exception as exc:  # noqa: BLE001
            self.host.abort(request.request_id)
            self.post_message(AnswerRejected(_error_text(exc)))
            return
        self.post_message(AnswerFinished(final))

    @on(AnswerProgressed)
    def on_answer_progressed(self, message: AnswerProgressed) -> None:
        progress = message.progress
        if progress.request_id != self._request_id or self._answer is None:
            return
        self._answer.show(progress.text)
        self.stats.show_answer(progress.stats)
        self.stats.show_engine(progress.engine)
        self.view.follow()

    @on(AnswerFinished)
    def on_answer_finished(self, message: AnswerFinished) -> None:
        progress = message.progress
        if progress.request_id != self._request_id or self._answer is None:
            return
        view, answer, reason = self.view, self._answer, progress.finish_reason
        answer.show(progress.text)
        self.stats.show_answer(progress.stats)
        self.stats.show_engine(progress.engine)
        if reason == "error" or (reason == "abort" and not progress.text):
            # Nothing worth keeping: take the question back so it can be edited and resent.
            answer.remove()
            self._restore_prompt(self._drop_unanswered_turn())
            if reason == "error":
                error = (progress.error or "unknown error").rstrip(". ")
                view.add_notice(
                    f"The answer failed: {error}. Try again, or reload the model (Ctrl+L).",
                    error=True,
                )
            else:
                view.add_notice("Stopped before the first token.")
        else:
            if reason == "abort":
                view.end_answer(answer, "⏹ stopped")
            elif reason == "length":
                view.end_answer(answer, "… hit the max-tokens limit (Ctrl+S to raise it)")
            self.conversation.add("assistant", progress.text)
            self._last_answer_text = progress.text
            # The worker writes a copy: the next message may change this one meanwhile.
            self.save_conversation(Conversation.from_json(self.conversation.to_json()))
        self._finish_answer()
        view.follow()

    @on(AnswerRejected)
    def on_answer_rejected(self, message: AnswerRejected) -> None:
        if self._answer is not None:
            self._answer.remove()
        text = self._drop_unanswered_turn()
        self.view.add_notice(
            f"Not answered: {message.error}. Shorten the message, start a new conversation "
            "(Ctrl+N), or raise the context in Settings (Ctrl+S).",
            error=True,
        )
        self._restore_prompt(text)
        self._finish_answer()

    def _restore_prompt(self, text: str) -> None:
        if text and not self.prompt.text:
            self.prompt.load_text(text)

    def _drop_unanswered_turn(self) -> str:
        """Take the last user turn back out of the conversation (it got no answer)."""
        messages = self.conversation.messages
        if messages and messages[-1].role == "user":
            return messages.pop().content
        return ""

    def _finish_answer(self) -> None:
        self.answering = False
        self._answer = None
        self._set_status(f"Ready · {self.host.describe()}" if self.host.loaded else "No model")
        self.refresh_memory()

    def action_stop(self) -> None:
        if self.answering and self._request_id is not None:
            self._stop.set()
            self.host.abort(self._request_id)
            self._set_status("Stopping…")

    # -- conversations -------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="save")
    def save_conversation(self, conversation: Conversation) -> None:
        try:
            self.store.save(conversation)
        except (OSError, LocalinferError) as exc:
            self.call_from_thread(
                self.notify, f"Could not save the conversation: {exc}", severity="error"
            )

    def action_new_conversation(self) -> None:
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.conversation = Conversation(system_prompt=self.conversation.system_prompt)
        self.view.clear()
        self.stats.show_answer(StatsSnapshot())
        self._last_answer_text = ""
        self.notify("New conversation.")

    def action_open_conversation(self) -> None:
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.list_conversations()

    @work(thread=True, exclusive=True, group="list")
    def list_conversations(self) -> None:
        self.post_message(ConversationsListed(self.store.list()))

    @on(ConversationsListed)
    def on_conversations_listed(self, message: ConversationsListed) -> None:
        self.push_screen(ConversationsScreen(message.summaries), self.open_conversation)

    def open_conversation(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            return
        try:
            conversation = self.store.load(conversation_id)
        except ConversationError as exc:
            self.view.add_notice(str(exc), error=True)
            return
        self.conversation = conversation
        self.view.show_conversation(conversation)
        answers = [m.content for m in conversation.messages if m.role == "assistant"]
        self._last_answer_text = answers[-1] if answers else ""

    def action_copy_answer(self) -> None:
        if not self._last_answer_text:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(self._last_answer_text)
        self.notify("Copied the last answer.")

    def action_system_prompt(self) -> None:
        self.push_screen(SystemPromptScreen(self.conversation.system_prompt), self._set_system)

    def _set_system(self, text: str | None) -> None:
        if text is None:
            return
        self.conversation.system_prompt = text
        self.notify("System prompt set: it applies from the next message.")

    # -- settings and models -------------------------------------------------------------------

    def action_settings(self) -> None:
        if self.loading:
            self.notify("A model is loading; settings open when it is ready.", severity="warning")
            return
        self.push_screen(SettingsScreen(self.host.settings), self.apply_settings)

    def apply_settings(self, settings: ChatSettings | None) -> None:
        if settings is None or settings == self.host.settings:
            return
        if self.host.settings.reload_needed(settings):
            if self.answering:
                self.notify("Stop the answer first (Esc), then apply.", severity="warning")
                return
            self._start_load(settings)
        else:
            self.host.settings = settings
            self.settings_summary.update(settings.describe())
            self.notify("Settings apply from the next message.")

    def action_pick_model(self) -> None:
        if self.loading:
            self.notify("A model is loading already.", severity="warning")
            return
        self._set_status("Checking which models fit…", busy=True)
        self.list_models(self.host.settings.ctx)

    @work(thread=True, exclusive=True, group="models")
    def list_models(self, ctx: int) -> None:
        try:
            choices = self.host.model_choices(ctx)
        except Exception as exc:  # noqa: BLE001
            error = f"could not list models: {_error_text(exc)}"
            self.post_message(ModelLoadFailed(error, "try again (Ctrl+L)", self.host.loaded))
            return
        self.post_message(ModelChoicesReady(choices, ctx))

    @on(ModelChoicesReady)
    def on_model_choices_ready(self, message: ModelChoicesReady) -> None:
        self._set_status(f"Ready · {self.host.describe()}" if self.host.loaded else "No model")
        self.push_screen(ModelPickerScreen(message.choices, message.ctx), self._pick)

    def _pick(self, name: str | None) -> None:
        if name is None:
            return
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self._start_load(self.host.settings.changed(model=name))

    def _start_load(self, settings: ChatSettings) -> None:
        self.loading = True
        name = settings.model or "the embedded model"
        self._set_status(f"Loading {name}…", busy=True)
        self.prompt.placeholder = LOADING_PLACEHOLDER
        self.load_model(settings)

    @work(thread=True, exclusive=True, group="load")
    def load_model(self, settings: ChatSettings) -> None:
        try:
            self.host.load(settings)
        except Exception as exc:  # noqa: BLE001 - shown in the UI with what to do next
            self.post_message(ModelLoadFailed(_error_text(exc), _load_hint(exc), self.host.loaded))
            return
        notices = [getattr(self.host.session, "runner_notice", None)]
        notice = " · ".join(n for n in notices if n) or None
        self.post_message(ModelLoaded(self.host.describe(), notice))

    @on(ModelLoaded)
    def on_model_loaded(self, message: ModelLoaded) -> None:
        self._set_ready(message.description, message.notice)
        # The budget's prediction takes a moment (it reads file headers): after "Ready", not before.
        self.refresh_memory()

    @on(ModelLoadFailed)
    def on_model_load_failed(self, message: ModelLoadFailed) -> None:
        self.loading = False
        view = self.view
        if message.still_loaded:
            self._set_ready(self.host.describe(), None)
            view.add_notice(
                f"{message.error}. Still using {self.host.session.model.name}; {message.hint}.",
                error=True,
            )
        else:
            self._set_status("No model loaded")
            view.add_notice(
                f"Could not load a model: {message.error}. Next: {message.hint}.", error=True
            )

    @work(thread=True, exclusive=True, group="memory")
    def refresh_memory(self) -> None:
        try:
            figures = self.host.memory()
        except Exception:  # noqa: BLE001 - the bar simply keeps its last figures
            return
        self.post_message(MemoryMeasured(figures))

    @on(MemoryMeasured)
    def on_memory_measured(self, message: MemoryMeasured) -> None:
        self.memory_bar.show(message.figures)

    # -- shutdown ------------------------------------------------------------------------------

    async def action_quit(self) -> None:
        if self._request_id is not None and self.answering:
            self.host.abort(self._request_id)
        self.exit()
