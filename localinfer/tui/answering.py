"""Sending a message and streaming its answer: the worker that tokenizes, submits and pumps the
engine's events, and the handlers that show the answer, end it, or take the question back."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from textual import on, work

from localinfer.conversations import Conversation, MessageImage
from localinfer.engine.types import EngineMetrics, SamplingParams
from localinfer.tui.context_actions import ContextActions
from localinfer.tui.conversation_actions import ConversationActions
from localinfer.tui.conversation_view import AnswerTurn
from localinfer.tui.failure_text import error_text
from localinfer.tui.live_stats import LiveStats, StatsSnapshot
from localinfer.tui.messages import (
    AnswerDelta,
    AnswerFinished,
    AnswerRejected,
    AnswerStatsUpdated,
    ReasoningDelta,
)
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.stream_pump import AnswerEnd, pump_answer
from localinfer.tui.thinking_actions import ThinkingActions

if TYPE_CHECKING:
    from localinfer.tools.thinking import Thinking


class AnswerActions(ConversationActions, ThinkingActions, ContextActions):
    """Answers; a finished one is saved with the conversation (hence ConversationActions), with
    thinking as Settings or a typed switch asks (ThinkingActions), cut to the context under the
    overflow policy (ContextActions)."""

    @on(PromptInput.Submitted)
    def on_prompt_submitted(self, event: PromptInput.Submitted) -> None:
        if self.image_command(event.text):  # /image PATH, /image clear (image_actions.py)
            return
        if self.answering or self.loading or not self.host.loaded:
            self.prompt.load_text(event.text)  # keep what was typed
            why = "an answer is still streaming (Esc stops it)"
            if not self.answering:
                why = "the model is still loading"
            self.notify(f"Not sent: {why}.", severity="warning")
            return
        self.send(event.text)

    def send(self, text: str, images: list[MessageImage] | None = None) -> None:
        """Ask ``text`` with ``images`` (None: the ones attached to the next message)."""
        typed = self.read_thinking(text)
        if typed.bare:
            self.prompt.load_text(text)
            self.notify(
                f"Not sent: {typed.switch} goes with a message (Settings, Ctrl+S, sets thinking "
                "for every message).",
                severity="warning",
            )
            return
        self.conversation.model = self.host.model_name()
        attached = self.take_pending() if images is None else images
        self.conversation.add("user", typed.text, images=attached)
        self._question = self.view.add_user(typed.text, attached)
        if typed.note:
            self.view.add_notice(typed.note)
        self._answer = self.view.start_answer()
        self._thinking_since = None
        self._request_id = f"chat-{uuid.uuid4().hex[:12]}"
        self._stop.clear()
        self.answering = True
        self._set_status("Answering… (Esc stops)")
        self.stats.show_answer(StatsSnapshot(running=True))
        params = self.host.settings.sampling_params()
        thinking = self.message_thinking(typed)
        self.run_answer(self.conversation.prompt_messages(), params, self._request_id, thinking)

    @work(thread=True, exclusive=True, group="answer")
    def run_answer(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        request_id: str,
        thinking: Thinking | None = None,
    ) -> None:
        stats = LiveStats(clock=self.clock)
        try:
            prompt = self.prepare_in_context(messages, thinking, request_id)
            stats.start(prompt.prompt_tokens)
            handle = self.host.stream(prompt, params, request_id)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the UI
            self.post_message(AnswerRejected(error_text(exc), getattr(exc, "hint", None)))
            return
        if self._stop.is_set():
            self.host.abort(request_id)
        sink = _MessageSink(self, request_id)
        self.render_pace.start()
        try:
            end = pump_answer(
                request_id, handle, stats, sink, self.host.engine_metrics, self.clock,
                pace=self.render_pace.interval,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            self.host.abort(request_id)
            self.post_message(AnswerRejected(error_text(exc), getattr(exc, "hint", None)))
            return
        self.post_message(AnswerFinished(end))

    @on(AnswerDelta)
    async def on_answer_delta(self, message: AnswerDelta) -> None:
        if message.request_id == self._request_id and self._answer is not None:
            self.render_pace.updated()
            self._fold_thinking()
            await self._answer.write(message.text)

    @on(ReasoningDelta)
    def on_reasoning_delta(self, message: ReasoningDelta) -> None:
        if message.request_id == self._request_id and self._answer is not None:
            self._reason(self._answer, message.text)

    def _reason(self, answer: AnswerTurn, text: str) -> None:
        self.render_pace.updated()
        self.view.thinking_for(answer).append(text)
        if self._thinking_since is None:  # the first reasoning: its block is new
            self._thinking_since = self.clock()
            self.refresh_thinking_key()

    def _fold_thinking(self) -> None:
        """The answer starts: the reasoning above it folds to one line (unless all are shown)."""
        since, self._thinking_since = self._thinking_since, None
        if since is None or self._answer is None:
            return
        block = self.view.thinking_for(self._answer)
        block.fold(self.clock() - since, None, keep_open=self.reasoning_shown)

    @on(AnswerStatsUpdated)
    def on_answer_stats_updated(self, message: AnswerStatsUpdated) -> None:
        if message.request_id == self._request_id and self._answer is not None:
            self.stats.show_answer(message.stats)
            self.stats.show_engine(message.engine)

    @on(AnswerFinished)
    async def on_answer_finished(self, message: AnswerFinished) -> None:
        end = message.end
        if end.request_id != self._request_id or self._answer is None:
            return
        answer, reason = self._answer, end.finish_reason
        if end.reasoning_tail:
            self._reason(answer, end.reasoning_tail)
        if end.text:
            self._fold_thinking()
        if end.tail:
            await answer.write(end.tail)
        await answer.end_stream()
        self.stats.show_answer(end.stats)
        self.stats.show_engine(end.engine)
        block = self.view.thinking_above(answer)
        if block is not None:
            block.count(end.stats.reasoning_tokens)  # the engine's exact count
        if reason in ("error", "abort") and not end.text:
            # Nothing worth keeping: take the question back so it can be edited and resent.
            if block is not None:
                block.remove()
            answer.remove()
            self._restore_prompt(self._drop_unanswered_turn())
            self._notice_unanswered(end)
        else:
            self._keep_answer(end)
        self._finish_answer()

    def _notice_unanswered(self, progress: AnswerEnd) -> None:
        if progress.finish_reason == "error":
            error = (progress.error or "unknown error").rstrip(". ")
            self.view.add_notice(f"The answer failed: {error}. {self._after_failure()}", error=True)
        else:
            self.view.add_notice("Stopped before the first token.")

    def _after_failure(self) -> str:
        if self.host.remote_url is not None:
            return f"Try again, or check the server at {self.host.remote_url}."
        return "Try again, or reload the model (Ctrl+L)."

    def _keep_answer(self, progress: AnswerEnd) -> None:
        assert self._answer is not None
        if progress.finish_reason == "abort":
            self.view.end_answer(self._answer, "⏹ stopped")
        elif progress.finish_reason == "error":
            # What arrived before the failure is worth keeping (a dropped server stream).
            self.view.end_answer(self._answer, "⚠ cut short")
            error = (progress.error or "unknown error").rstrip(". ")
            self.view.add_notice(
                f"The answer broke off: {error}. The part that arrived is kept. "
                f"{self._after_failure()}",
                error=True,
            )
        elif progress.finish_reason == "length":
            self.view.end_answer(self._answer, "… hit the max-tokens limit (Ctrl+S to raise it)")
        answer = self.conversation.add("assistant", progress.text, progress.reasoning)
        answer.stats = progress.stats.saved_figures()
        self._last_answer_text = progress.text
        # The worker writes a copy: the next message may change this one meanwhile.
        self.save_conversation(Conversation.from_json(self.conversation.to_json()))

    @on(AnswerRejected)
    async def on_answer_rejected(self, message: AnswerRejected) -> None:
        if self._answer is not None:
            await self._answer.end_stream()
            self._answer.remove()
        text = self._drop_unanswered_turn()
        hint = message.hint or (
            "shorten the message, start a new conversation (Ctrl+N), or raise the context in "
            "Settings (Ctrl+S)"
        )
        next_step = hint[:1].upper() + hint[1:]
        self.view.add_notice(f"Not answered: {message.error}. {next_step}.", error=True)
        self._restore_prompt(text)
        self._finish_answer()

    def _restore_prompt(self, text: str) -> None:
        if text and not self.prompt.text:
            self.prompt.load_text(text)

    def _drop_unanswered_turn(self) -> str:
        """Take the last user turn back out of the conversation (it got no answer)."""
        messages = self.conversation.messages
        if self._question is not None:
            # Off the screen too: it goes back into the prompt, and a resend shows it again.
            self._question.remove()
            self._question = None
        if messages and messages[-1].role == "user":
            question = messages.pop()
            self.restore_pending(question.images)  # they go with the message when resent
            return question.content
        return ""

    def _finish_answer(self) -> None:
        self.answering = False
        self._answer = None
        self._question = None
        self._set_status(self._idle_status())
        if self._quit_pending:
            self.call_later(self.action_quit)  # the stopped answer is saved: now quit
            return
        self.refresh_memory()

    def action_stop(self) -> None:
        if self.answering and self._request_id is not None:
            self._stop.set()
            self.host.abort(self._request_id)
            self._set_status("Stopping…")


class _MessageSink:
    """The pump's updates as messages to the app (posting is safe from the worker thread)."""

    def __init__(self, app: AnswerActions, request_id: str) -> None:
        self._app, self._request_id = app, request_id

    def text(self, delta: str) -> None:
        self._app.post_message(AnswerDelta(self._request_id, delta))

    def reasoning(self, delta: str) -> None:
        self._app.post_message(ReasoningDelta(self._request_id, delta))

    def stats(self, snapshot: StatsSnapshot, engine: EngineMetrics | None) -> None:
        self._app.post_message(AnswerStatsUpdated(self._request_id, snapshot, engine))
