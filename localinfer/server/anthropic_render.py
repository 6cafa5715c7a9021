"""One answer written as Anthropic's Messages API writes it: a ``message`` object, or its stream.

    event: message_start        {"message": {... "content": [], "usage": {"input_tokens": n}}}
    event: content_block_start  {"index": 0, "content_block": {"type": "thinking", ...}}
    event: content_block_delta  {"index": 0, "delta": {"type": "thinking_delta", ...}}
    event: content_block_delta  {"index": 0, "delta": {"type": "signature_delta", ...}}
    event: content_block_stop   {"index": 0}
    event: content_block_start  {"index": 1, "content_block": {"type": "text", "text": ""}}
    event: content_block_delta  {"index": 1, "delta": {"type": "text_delta", "text": "..."}}
    event: content_block_stop   {"index": 1}
    event: content_block_start  {"index": 2, "content_block": {"type": "tool_use", ...}}
    event: content_block_delta  {"index": 2, "delta": {"type": "input_json_delta", ...}}
    ...
    event: message_delta        {"delta": {"stop_reason": "tool_use"}, "usage": {...}}
    event: message_stop

Text and tool calls arrive as the answer shape's deltas (``answer_shape``); each run of one kind
is a content block. Whitespace that ends the text before a tool call (the newline before
``<tool_call>``) is no block of its own: the stream holds a text's trailing whitespace until
more text follows, and the whole message strips it when calls follow, so both agree.

A thinking model's reasoning is a ``thinking`` block before the text when the request enabled
thinking (``thinking`` enabled or adaptive), and left out otherwise: Anthropic's clients (Claude
Code) expect thinking blocks only when they asked for them, and never find the reasoning in the
text either way. The block's ``signature`` is a digest of its text (``signature``).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from localinfer.engine.types import TokenLogprob
from localinfer.server.answer_render import FinishedAnswer, delta_events
from localinfer.server.errors import APIError
from localinfer.tools import StreamDelta, ToolCall, ToolCallArguments, ToolCallStart

# The engine's finish reasons (after the answer shape) as Anthropic's stop reasons; "stop" by one
# of ``stop_sequences`` is "stop_sequence" (stop_reason below).
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

# Whether the answer carries thinking blocks: None (not asked), "text" or "omitted" (the blocks
# without their text: Anthropic's ``display: omitted``).
ThinkingShown = Literal["text", "omitted"] | None
BlockKind = Literal["thinking", "text", "tool_use"]


def stop_reason(answer: FinishedAnswer) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for an answer."""
    if answer.finish_reason == "stop" and answer.stop_sequence is not None:
        return "stop_sequence", answer.stop_sequence
    return STOP_REASONS.get(answer.finish_reason, "end_turn"), None


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells them (``toolu_...``). Any id round-trips: the history's
    tool_use and tool_result carry the same one into the template."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A call as a ``tool_use`` block. A forced call cut short by max_tokens has arguments that
    are not JSON yet (answer_shape): its input is ``{}``, under stop_reason max_tokens."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        arguments = {}
    return {
        "type": "tool_use",
        "id": tool_use_id(call.id),
        "name": call.name,
        "input": arguments if isinstance(arguments, dict) else {},
    }


def signature(thinking: str) -> str:
    """A thinking block's ``signature``. Anthropic's is an opaque proof that its model wrote the
    block; this server has nothing to prove and checks none it is sent back, so it writes a
    digest of the text (clients that keep blocks only with a signature keep these)."""
    return "localinfer-sha256-" + hashlib.sha256(thinking.encode()).hexdigest()


def thinking_block(thinking: str, shown: ThinkingShown) -> dict[str, Any]:
    text = thinking if shown == "text" else ""
    return {"type": "thinking", "thinking": text, "signature": signature(thinking)}


def event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE message with Anthropic's ``event:`` line (its type, repeated in ``data``)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class AnthropicRenderer:
    """Writes one answer as a ``message`` or as its event stream (an ``AnswerRenderer``)."""

    def __init__(self, model: str, input_tokens: int, thinking: ThinkingShown = None) -> None:
        self._id = new_message_id()
        self.model = model
        self.input_tokens = input_tokens
        self.thinking = thinking
        self._blocks = 0  # content blocks started so far
        self._open: BlockKind | None = None
        self._held = ""  # trailing whitespace of the text so far
        self._thought: list[str] = []  # the reasoning so far, for its block's signature

    @property
    def id(self) -> str:
        return self._id

    # -- whole --------------------------------------------------------------------------------

    def whole(self, answer: FinishedAnswer) -> dict[str, Any]:
        text = answer.content.rstrip() if answer.calls else answer.content
        content: list[dict[str, Any]] = []
        if self.thinking is not None and answer.reasoning:
            content.append(thinking_block(answer.reasoning, self.thinking))
        if text:
            content.append({"type": "text", "text": text})
        content.extend(tool_use_block(call) for call in answer.calls)
        reason, sequence = stop_reason(answer)
        return {
            **self._message(content),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": _output(answer)},
        }

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
        }

    # -- stream -------------------------------------------------------------------------------

    def opening(self) -> list[bytes]:
        message = {
            **self._message([]),
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [event("message_start", {"type": "message_start", "message": message})]

    def deltas(
        self, deltas: Sequence[StreamDelta], logprobs: Sequence[TokenLogprob]
    ) -> list[bytes]:
        return delta_events(deltas, self._text, self._call, self._arguments, self._reasoning)

    def closing(self, answer: FinishedAnswer) -> list[bytes]:
        out = self._text_now(self._held) if not answer.calls else []
        out += self._stop()
        reason, sequence = stop_reason(answer)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        usage = {"input_tokens": self.input_tokens, "output_tokens": _output(answer)}
        data = {"type": "message_delta", "delta": delta, "usage": usage}
        out.append(event("message_delta", data))
        out.append(event("message_stop", {"type": "message_stop"}))
        return out

    def failure(self, error: APIError) -> list[bytes]:
        return [event("error", error.anthropic_body())]

    def _reasoning(self, text: str) -> list[bytes]:
        if self.thinking is None:
            return []  # not asked for: left out (never in the text)
        self._thought.append(text)
        block = {"type": "thinking", "thinking": "", "signature": ""}
        out = [] if self._open == "thinking" else self._start("thinking", block)
        if self.thinking == "omitted":
            return out
        return [*out, self._delta({"type": "thinking_delta", "thinking": text})]

    def _call(self, start: ToolCallStart) -> list[bytes]:
        self._held = ""
        block = {"type": "tool_use", "id": tool_use_id(start.id), "name": start.name}
        return self._start("tool_use", {**block, "input": {}})

    def _arguments(self, piece: ToolCallArguments) -> list[bytes]:
        if not piece.fragment:
            return []
        return [self._delta({"type": "input_json_delta", "partial_json": piece.fragment})]

    def _text(self, text: str) -> list[bytes]:
        pending = self._held + text
        shown = pending.rstrip()
        self._held = pending[len(shown) :]
        return self._text_now(shown)

    def _text_now(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = [] if self._open == "text" else self._start("text", {"type": "text", "text": ""})
        return [*out, self._delta({"type": "text_delta", "text": text})]

    def _start(self, kind: BlockKind, block: dict[str, Any]) -> list[bytes]:
        out = self._stop()
        self._open = kind
        self._blocks += 1
        data = {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}
        return [*out, event("content_block_start", data)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}
        return event("content_block_delta", data)

    def _stop(self) -> list[bytes]:
        """The open block's end; a thinking block's signature comes just before it."""
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":
            sign = signature("".join(self._thought))
            out.append(self._delta({"type": "signature_delta", "signature": sign}))
        self._open = None
        data = {"type": "content_block_stop", "index": self._blocks - 1}
        return [*out, event("content_block_stop", data)]


def _output(answer: FinishedAnswer) -> int:
    metrics = answer.metrics
    return metrics.completion_tokens if metrics is not None else answer.completion_tokens
