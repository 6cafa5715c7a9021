"""The seam between one engine answer and one HTTP API's shape of it.

``generation`` runs every API's request the same way (admission before the status line, client
disconnects, answer shapes for tool calls); an ``AnswerRenderer`` says only how that answer is
written: the whole JSON body, or the stream's events. OpenAI's chat and text completions render
with ``OpenAIRenderer``; other APIs (Anthropic Messages, Responses) bring their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from localinfer.engine.types import RequestMetrics, TokenLogprob
from localinfer.server.errors import APIError
from localinfer.server.responses import ResponseBuilder
from localinfer.server.streaming import SSE_DONE, sse
from localinfer.tools import StreamDelta, ToolCall


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


class OpenAIRenderer:
    """Chat and text completions, whole or as ``chat.completion.chunk`` / ``text_completion``
    SSE chunks ending with ``data: [DONE]``."""

    def __init__(self, builder: ResponseBuilder, echo: str = "") -> None:
        self.builder = builder
        self.echo = echo  # text completions with echo: the prompt text, sent before the answer

    @property
    def id(self) -> str:
        return self.builder.id

    def whole(self, answer: FinishedAnswer) -> dict[str, Any]:
        return self.builder.response(
            answer.content,
            answer.finish_reason,
            answer.logprobs,
            answer.metrics,
            answer.prompt_tokens,
            answer.completion_tokens,
            echo_prefix=self.echo,
            tool_calls=answer.calls,
        )

    def opening(self) -> list[bytes]:
        head = self.builder.first_chunk(self.echo)
        return [] if head is None else [sse(head)]

    def deltas(
        self, deltas: Sequence[StreamDelta], logprobs: Sequence[TokenLogprob]
    ) -> list[bytes]:
        return [sse(chunk) for chunk in self.builder.delta_chunks(deltas, logprobs)]

    def closing(self, answer: FinishedAnswer) -> list[bytes]:
        out = [sse(self.builder.finish_chunk(answer.finish_reason, answer.metrics))]
        if self.builder.include_usage:
            usage = self.builder.usage_chunk(
                answer.metrics, answer.prompt_tokens, answer.completion_tokens
            )
            out.append(sse(usage))
        return [*out, SSE_DONE]

    def failure(self, error: APIError) -> list[bytes]:
        return [sse(error.body()), SSE_DONE]
