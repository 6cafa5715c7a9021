"""The seam between one engine answer and one HTTP API's shape of it.

``generation`` runs every API's request the same way (admission before the status line, client
disconnects, answer shapes for tool calls); an ``AnswerRenderer`` says only how that answer is
written: the whole JSON body, or the stream's events. Each API has its renderer:
``openai_render`` (chat and text completions), ``anthropic_render`` (Messages) and
``responses_api_render`` (Responses); the last two write each delta as typed events of their
own through ``delta_events``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from localinfer.engine.types import RequestMetrics, TokenLogprob
from localinfer.server.errors import APIError
from localinfer.tools import (
    ContentDelta,
    ReasoningDelta,
    StreamDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
)


@dataclass(slots=True, frozen=True)
class FinishedAnswer:
    """A whole answer, after its answer shape read it."""

    content: str
    calls: Sequence[ToolCall]
    finish_reason: str  # "stop", "length" or "tool_calls"
    logprobs: Sequence[TokenLogprob]
    metrics: RequestMetrics | None
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the stop string that ended the answer, when one did
    reasoning: str = ""  # a thinking model's reasoning, apart from ``content``


class AnswerRenderer(Protocol):
    """How one API writes an answer. Stream methods return whole SSE messages (bytes)."""

    @property
    def id(self) -> str: ...

    def whole(self, answer: FinishedAnswer) -> dict[str, Any]: ...

    def opening(self) -> list[bytes]: ...

    def deltas(
        self, deltas: Sequence[StreamDelta], logprobs: Sequence[TokenLogprob]
    ) -> list[bytes]: ...

    def closing(self, answer: FinishedAnswer) -> list[bytes]: ...

    def failure(self, error: APIError) -> list[bytes]: ...


def delta_events(
    deltas: Sequence[StreamDelta],
    text: Callable[[str], list[bytes]],
    call: Callable[[ToolCallStart], list[bytes]],
    arguments: Callable[[ToolCallArguments], list[bytes]],
    reasoning: Callable[[str], list[bytes]] | None = None,
) -> list[bytes]:
    """The SSE messages for one engine event's deltas, in order: ``text`` writes a piece of
    content, ``call`` a tool call's start, ``arguments`` a piece of its arguments and
    ``reasoning`` a piece of reasoning (None: the API does not show reasoning; it is left out,
    never mixed into the content)."""
    out: list[bytes] = []
    for delta in deltas:
        if isinstance(delta, ReasoningDelta):
            out += reasoning(delta.text) if reasoning is not None else []
        elif isinstance(delta, ContentDelta):
            out += text(delta.text)
        elif isinstance(delta, ToolCallStart):
            out += call(delta)
        else:
            out += arguments(delta)
    return out
