"""Sending a message and streaming its answer: the worker that tokenizes, submits and pumps the
engine's events, and the handlers that show the answer, end it, or take the question back."""

from __future__ import annotations

import uuid

from textual import on, work

from localinfer.conversations import Conversation
from localinfer.engine.types import Request
from localinfer.tui.conversation_actions import ConversationActions
from localinfer.tui.failure_text import error_text
from localinfer.tui.live_stats import LiveStats, StatsSnapshot
from localinfer.tui.messages import AnswerFinished, AnswerProgressed, AnswerRejected
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.stream_pump import AnswerProgress, pump_answer


class AnswerActions(ConversationActions):
    """Answers; a finished one is saved with the conversation (hence ConversationActions)."""

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
            self.post_message(AnswerRejected(error_text(exc)))
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
            self.post_message(AnswerRejected(error_text(exc)))
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
        answer, reason = self._answer, progress.finish_reason
        answer.show(progress.text)
        self.stats.show_answer(progress.stats)
        self.stats.show_engine(progress.engine)
        if reason == "error" or (reason == "abort" and not progress.text):
            # Nothing worth keeping: take the question back so it can be edited and resent.
            answer.remove()
            self._restore_prompt(self._drop_unanswered_turn())
            self._notice_unanswered(progress)
        else:
            self._keep_answer(progress)
        self._finish_answer()
        self.view.follow()

    def _notice_unanswered(self, progress: AnswerProgress) -> None:
        if progress.finish_reason == "error":
            error = (progress.error or "unknown error").rstrip(". ")
            self.view.add_notice(
                f"The answer failed: {error}. Try again, or reload the model (Ctrl+L).",
                error=True,
            )
        else:
            self.view.add_notice("Stopped before the first token.")

    def _keep_answer(self, progress: AnswerProgress) -> None:
        assert self._answer is not None
        if progress.finish_reason == "abort":
            self.view.end_answer(self._answer, "⏹ stopped")
        elif progress.finish_reason == "length":
            self.view.end_answer(self._answer, "… hit the max-tokens limit (Ctrl+S to raise it)")
        self.conversation.add("assistant", progress.text)
        self._last_answer_text = progress.text
        # The worker writes a copy: the next message may change this one meanwhile.
        self.save_conversation(Conversation.from_json(self.conversation.to_json()))

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
        self._set_status(self._idle_status())
        self.refresh_memory()

    def action_stop(self) -> None:
        if self.answering and self._request_id is not None:
            self._stop.set()
            self.host.abort(self._request_id)
            self._set_status("Stopping…")
