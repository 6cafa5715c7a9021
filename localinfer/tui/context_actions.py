"""A conversation longer than the context (#39): the answer worker fits the prompt under the
overflow policy (Settings, `chat --context-overflow`) before it is submitted, and the app moves
the line that marks where the model's context begins.

``drop-oldest`` leaves out the oldest whole turns (context_fit.fit_with_room); ``summarize`` also
has the model summarize them first (context_summary.py); ``stop`` sends the conversation whole
and the engine refuses what does not fit. The turns left out stay on the screen and in the file;
the conversation's ``context_start`` says where the model's context begins, so every later
prompt starts there and appends to what the engine cached (with ``--cut-kv shift`` the cut's
kept turns keep their KV too: the engine moves it into place).

The worker never changes the conversation: it posts :class:`ContextCut`, and the handler, on the
UI thread, moves ``context_start``, saves the summary and draws the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on
from textual.message import Message

from localinfer.context_fit import (
    OverflowPolicy,
    describe_outside,
    fit_with_room,
    outside_count,
    summary_room,
    window_messages,
    window_start,
)
from localinfer.conversations import ChatMessage
from localinfer.tui.app_base import ChatAppBase
from localinfer.tui.context_marker import add_summary, place_marker
from localinfer.tui.context_summary import summary_prompt, write_summary

if TYPE_CHECKING:
    from localinfer.tools.thinking import Thinking
    from localinfer.tui.answer_source import PreparedPrompt


@dataclass
class ContextCut(Message):
    """The worker left out ``dropped`` messages after the context's old start (the oldest whole
    turns), summarized as ``summary`` ('' for none) under ``summarize``."""

    request_id: str
    dropped: int
    summary: str = ""
    failure: str = ""  # why there is no summary under summarize


@dataclass
class ContextSummarizing(Message):
    """The worker is writing a summary of ``messages`` left-out messages."""

    request_id: str
    messages: int


class ContextActions(ChatAppBase):
    def prepare_in_context(
        self, messages: list[dict[str, str]], thinking: Thinking | None, request_id: str
    ) -> PreparedPrompt:
        """(Worker thread.) The prompt for ``messages``, the conversation's window, cut to fit
        the context under the overflow policy. Raises ContextOverflowError for a question that
        alone exceeds it. Messages that are not the conversation's window (another caller's),
        and a server's chat (the server counts), are prepared as they are."""
        host, conversation = self.host, self.conversation
        policy = OverflowPolicy(host.settings.context_overflow)
        system, shown = conversation.system_prompt, list(conversation.messages)
        start = window_start(shown, conversation.context_start)
        if (
            policy is OverflowPolicy.STOP
            or host.remote_url is not None
            or window_messages(system, shown, start) != messages
        ):
            return host.prepare(messages, thinking)
        ctx, max_tokens = host.settings.ctx, host.settings.max_tokens

        def count(m: list[dict[str, str]]) -> int:
            return host.prepare(m, thinking).prompt_tokens

        keep = summary_room(ctx) if policy is OverflowPolicy.SUMMARIZE else 0
        fit = fit_with_room(messages, count, ctx, max_tokens, policy, keep)
        if not fit.dropped:
            return host.prepare(messages, thinking)
        cut = start + fit.dropped
        summary, failure = "", ""
        if policy is OverflowPolicy.SUMMARIZE:
            self.post_message(ContextSummarizing(request_id, outside_count(shown, cut)))
            asked = summary_prompt(system, shown, start, cut, count, ctx)
            written = write_summary(host, asked, ctx, f"{request_id}-summary", self._stop)
            summary, failure = written.text, written.failure
        self.post_message(ContextCut(request_id, fit.dropped, summary, failure))
        if summary:
            shown.insert(cut, ChatMessage("system", summary))
            cut += 1
        return host.prepare(window_messages(system, shown, cut), thinking)

    @on(ContextSummarizing)
    def on_context_summarizing(self, message: ContextSummarizing) -> None:
        if message.request_id == self._request_id:
            n = message.messages
            self._set_status(f"Summarizing {n} earlier message{'s' if n != 1 else ''}… (Esc stops)")

    @on(ContextCut)
    def on_context_cut(self, message: ContextCut) -> None:
        """Move the context's start past the left-out messages (the same arithmetic the worker
        did on its copy), keep the summary above the line, and move the line."""
        conversation = self.conversation
        cut = window_start(conversation.messages, conversation.context_start) + message.dropped
        if message.summary:
            conversation.messages.insert(cut, ChatMessage("system", message.summary))
            add_summary(self.view, conversation, cut)
            cut += 1
        conversation.context_start = cut
        place_marker(self.view, conversation)
        if message.request_id == self._request_id:
            self._set_status("Answering… (Esc stops)")
        said = describe_outside(outside_count(conversation.messages, cut))
        if message.failure:
            said += f" (no summary: {message.failure})"
        self.notify(f"{said[:1].upper()}{said[1:]}. A line marks where its context now begins.")
