"""An answer as OpenAI's Responses API writes it: a Response object, or its typed event stream.

Whole: ``{"object": "response", "status": "completed" | "incomplete", "output": [items],
"usage": ...}`` with a thinking model's ``reasoning`` item, a ``message`` item (its
``output_text``) and a ``function_call`` item per call (responses_api_items). Streamed: each
SSE message has an ``event:`` line naming its type and a ``sequence_number``::

    response.created, response.in_progress
    a reasoning item: output_item.added, content_part.added, reasoning_text.delta...,
        reasoning_text.done, content_part.done, output_item.done
    per message item: output_item.added, content_part.added, output_text.delta...,
        output_text.done, content_part.done, output_item.done
    per call item: output_item.added, function_call_arguments.delta..., .done, output_item.done
    response.completed (or response.incomplete), carrying the whole response and its usage

A whole answer's text is one message item before its calls (the answer shape joins the text);
a stream opens a message item where text comes, so text written after a call is an item after
it there. Whitespace between calls opens no item. An error after the stream began is an
``error`` event. Shapes follow the ``openai`` SDK's types
(openai/types/responses), so ``client.responses.create`` and ``.stream`` read them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localinfer.engine.types import TokenLogprob
from localinfer.server.answer_render import FinishedAnswer, delta_events
from localinfer.server.errors import APIError
from localinfer.server.openai_render import timings
from localinfer.server.responses_api_items import (
    call_item,
    message_item,
    new_id,
    output_text,
    reasoning_item,
    reasoning_text,
    usage,
    whole_output,
)
from localinfer.tools import StreamDelta, ToolCallArguments, ToolCallStart


@dataclass(slots=True)
class ResponseHead:
    """What every Response object of one request repeats: its id and time, the served model,
    and the request's settings as OpenAI echoes them."""

    model: str
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    parallel_tool_calls: bool
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    text: dict[str, Any]
    reasoning_effort: str | None = None  # the request's reasoning.effort, echoed
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self, output: list[dict[str, Any]], answer: FinishedAnswer | None = None
    ) -> dict[str, Any]:
        """The Response object: in progress without ``answer``, else completed or incomplete
        (cut by max_output_tokens or the context), with usage and ``timings`` (an extension)."""
        status = "in_progress" if answer is None else "completed"
        if answer is not None and answer.finish_reason == "length":
            status = "incomplete"
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": {"effort": self.reasoning_effort, "summary": None},
            "store": False,
            "temperature": self.temperature,
            "text": self.text,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": None if answer is None else usage(answer),
            "metadata": {},
        }
        if answer is not None:
            body["completed_at"] = int(time.time()) if status == "completed" else None
            body["timings"] = timings(answer.metrics)
        return body


@dataclass(slots=True)
class _OpenItem:
    """The output item being streamed: its index in ``output``, its id and the text so far."""

    index: int
    item: dict[str, Any]
    parts: list[str] = field(default_factory=list)

    @property
    def is_message(self) -> bool:
        return self.item["type"] == "message"

    @property
    def is_reasoning(self) -> bool:
        return self.item["type"] == "reasoning"


class ResponsesRenderer:
    """The Responses API's ``AnswerRenderer`` (answer_render.py)."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items, in output order
        self._open: _OpenItem | None = None
        self._calls: dict[int, int] = {}  # tool call index -> output index
        self._pending = ""  # whitespace outside any message, held back (see _text)
        self._answered = False  # a message or call item has opened
        self._reasoned = False  # a reasoning item has opened

    @property
    def id(self) -> str:
        return self.head.id

    def whole(self, answer: FinishedAnswer) -> dict[str, Any]:
        return self.head.response(whole_output(answer), answer)

    def opening(self) -> list[bytes]:
        started = self.head.response([])
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]

    def deltas(
        self, deltas: Sequence[StreamDelta], logprobs: Sequence[TokenLogprob]
    ) -> list[bytes]:
        return delta_events(deltas, self._text, self._open_call, self._arguments, self._reasoning)

    def closing(self, answer: FinishedAnswer) -> list[bytes]:
        cut = answer.finish_reason == "length"
        out = []
        if not self._answered and not (cut and self._reasoned):
            # An empty (or blank) answer is still a message, as when whole; one cut short in
            # its reasoning has none (whole_output).
            pending, self._pending = self._pending, ""
            out += self._close("completed") + self._open_message() + self._text(pending)
        out += self._close("incomplete" if cut else "completed")
        final = self.head.response(list(self._output), answer)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=final)]

    def failure(self, error: APIError) -> list[bytes]:
        return [self._event("error", code=error.code, message=error.message, param=error.param)]

    # -- items -------------------------------------------------------------------------------

    def _text(self, text: str) -> list[bytes]:
        current = self._open
        if current is None or not current.is_message:
            # Whitespace between calls (a newline after a call's closing tag) opens no message
            # item of its own: it waits for text, or goes when a call or the answer comes.
            self._pending += text
            if not self._pending.strip():
                return []
            text, self._pending = self._pending, ""
            out = self._close("completed") + self._open_message()
        else:
            out = []
        if not text:
            return out
        current = self._open
        assert current is not None
        current.parts.append(text)
        return [*out, self._event("response.output_text.delta", **self._part(current), delta=text)]

    def _reasoning(self, text: str) -> list[bytes]:
        current = self._open
        out: list[bytes] = []
        if current is None or not current.is_reasoning:
            # The reasoning comes first: one item, before the message.
            self._reasoned = True
            out += self._close("completed")
            current = self._start(reasoning_item(new_id("rs"), None, "in_progress"))
            part = self._part(current, logprobs=False)
            out.append(self._added(current))
            out.append(self._event("response.content_part.added", **part, part=reasoning_text("")))
        current.parts.append(text)
        part = self._part(current, logprobs=False)
        return [*out, self._event("response.reasoning_text.delta", **part, delta=text)]

    def _open_message(self) -> list[bytes]:
        self._answered = True
        current = self._start(message_item(new_id("msg"), None, "in_progress"))
        part = self._part(current, logprobs=False)
        return [
            self._added(current),
            self._event("response.content_part.added", **part, part=output_text("")),
        ]

    def _open_call(self, start: ToolCallStart) -> list[bytes]:
        self._pending = ""  # whitespace before a call opens no message
        self._answered = True
        out = self._close("completed")
        current = self._start(call_item(new_id("fc"), start.id, start.name, "", "in_progress"))
        self._calls[start.index] = current.index
        return [*out, self._added(current)]

    def _added(self, current: _OpenItem) -> bytes:
        kind = "response.output_item.added"
        return self._event(kind, output_index=current.index, item=current.item)

    def _arguments(self, delta: ToolCallArguments) -> list[bytes]:
        current = self._open
        # Calls stream one after another: a call's pieces come before the next call starts.
        assert current is not None and self._calls.get(delta.index) == current.index
        current.parts.append(delta.fragment)
        where = {"item_id": current.item["id"], "output_index": current.index}
        kind = "response.function_call_arguments.delta"
        return [self._event(kind, **where, delta=delta.fragment)]

    def _start(self, item: dict[str, Any]) -> _OpenItem:
        self._open = _OpenItem(len(self._output), item)
        return self._open

    def _close(self, status: str) -> list[bytes]:
        """The open item's closing events; the item joins the output."""
        current, self._open = self._open, None
        if current is None:
            return []
        text = "".join(current.parts)
        item = dict(current.item, status=status)
        where = {"item_id": item["id"], "output_index": current.index}
        if current.is_reasoning:
            item["content"] = [reasoning_text(text)]
            part = self._part(current, logprobs=False)
            out = [
                self._event("response.reasoning_text.done", **part, text=text),
                self._event("response.content_part.done", **part, part=reasoning_text(text)),
            ]
        elif current.is_message:
            item["content"] = [output_text(text)]
            out = [
                self._event("response.output_text.done", **self._part(current), text=text),
                self._event(
                    "response.content_part.done",
                    **self._part(current, logprobs=False),
                    part=output_text(text),
                ),
            ]
        else:
            item["arguments"] = text
            out = [self._event("response.function_call_arguments.done", **where, arguments=text)]
        self._output.append(item)
        done = self._event("response.output_item.done", output_index=current.index, item=item)
        return [*out, done]

    # -- events ------------------------------------------------------------------------------

    @staticmethod
    def _part(current: _OpenItem, logprobs: bool = True) -> dict[str, Any]:
        where: dict[str, Any] = {
            "item_id": current.item["id"],
            "output_index": current.index,
            "content_index": 0,
        }
        if logprobs:
            where["logprobs"] = []
        return where

    def _event(self, kind: str, **fields: Any) -> bytes:
        """One SSE message: the ``event:`` line, then the event with its sequence number."""
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
