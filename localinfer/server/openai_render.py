"""One answer as OpenAI's chat and text completions write it: ``OpenAIRenderer`` (the
``AnswerRenderer`` of /v1/chat/completions, /v1/completions and /v1/fim/completions) over
``ResponseBuilder``, which turns engine results into the JSON: whole responses, stream chunks,
usage, logprobs, timings.

``ResponseBuilder`` holds what every object of one response shares (id, created, model, kind) so
the non-streaming body and each streamed chunk come from one place and stay consistent.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from localinfer.engine.types import RequestMetrics, TokenLogprob
from localinfer.server.answer_render import FinishedAnswer
from localinfer.server.errors import APIError
from localinfer.server.streaming import SSE_DONE, sse
from localinfer.tools import (
    ContentDelta,
    ReasoningDelta,
    StreamDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
)

Kind = Literal["chat", "completion"]
TokenBytes = Callable[[int], bytes]

# JSON has no -inf; OpenAI reports impossible tokens with this floor.
LOGPROB_FLOOR = -9999.0
SYSTEM_FINGERPRINT = "localinfer"


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def _lp(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _rate(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


def usage(
    metrics: RequestMetrics | None, prompt_tokens: int, completion_tokens: int, dropped: int = 0
) -> dict:
    if metrics is not None:
        prompt_tokens, completion_tokens = metrics.prompt_tokens, metrics.completion_tokens
    cached = metrics.cached_tokens if metrics is not None else 0
    reasoning = metrics.reasoning_tokens if metrics is not None else 0
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    if dropped:  # an extension: messages serve --context-overflow left out of the prompt
        out["dropped_messages"] = dropped
    return out


def timings(metrics: RequestMetrics | None) -> dict[str, Any] | None:
    """Per-request speed figures (an extension: OpenAI clients ignore unknown keys)."""
    if metrics is None:
        return None
    return {
        "prompt_tokens": metrics.prompt_tokens,
        "cached_tokens": metrics.cached_tokens,
        "completion_tokens": metrics.completion_tokens,
        "queued_ms": _ms(metrics.queued_s),
        "ttft_ms": _ms(metrics.ttft_s),
        "tpot_ms": _ms(metrics.tpot_s),
        "prompt_tokens_per_second": _rate(metrics.prefill_tps),
        "decode_tokens_per_second": _rate(metrics.decode_tps),
    }


def whole_call(call: ToolCall) -> dict[str, Any]:
    """A tool call in a whole chat.completion message."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def call_delta(delta: ToolCallStart | ToolCallArguments) -> dict[str, Any]:
    """A tool-call delta as OpenAI streams it: id, type and name first, then arguments."""
    if isinstance(delta, ToolCallStart):
        return {
            "index": delta.index,
            "id": delta.id,
            "type": "function",
            "function": {"name": delta.name, "arguments": ""},
        }
    return {"index": delta.index, "function": {"arguments": delta.fragment}}


def chat_logprobs(items: Sequence[TokenLogprob], token_bytes: TokenBytes) -> dict[str, Any]:
    def entry(token_id: int, text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": _lp(logprob), "bytes": list(token_bytes(token_id))}

    content = []
    for item in items:
        e = entry(item.token_id, item.text, item.logprob)
        e["top_logprobs"] = [entry(tid, text, lp) for tid, text, lp in item.top]
        content.append(e)
    return {"content": content, "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], text_offset: int = 0) -> dict[str, Any]:
    tokens, token_logprobs, top, offsets = [], [], [], []
    pos = text_offset
    for item in items:
        tokens.append(item.text)
        token_logprobs.append(_lp(item.logprob))
        alternatives: dict[str, float] = {}
        for _, text, lp in item.top:
            alternatives.setdefault(text, _lp(lp))  # two ids may share a text; keep the best
        top.append(alternatives)
        offsets.append(pos)
        pos += len(item.text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


@dataclass(slots=True)
class ResponseBuilder:
    kind: Kind
    model: str
    token_bytes: TokenBytes
    want_logprobs: bool = False
    include_usage: bool = False  # streaming: stream_options.include_usage
    dropped_messages: int = 0  # left out to fit the context (serve --context-overflow)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _text_pos: int = 0  # characters streamed so far (completion logprobs text_offset)
    # A content chunk's bytes split around its text, made on the first content_sse call.
    _content_parts: tuple[bytes, ...] | None = None  # () where no template could be made

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_id(self.kind)

    # -- whole responses ---------------------------------------------------------------------

    def response(
        self,
        text: str,
        finish_reason: str,
        logprobs: Sequence[TokenLogprob],
        metrics: RequestMetrics | None,
        prompt_tokens: int,
        completion_tokens: int,
        echo_prefix: str = "",
        tool_calls: Sequence[ToolCall] = (),
        reasoning: str = "",
    ) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if reasoning:  # a thinking model's, under llama-server's, vLLM's and DeepSeek's name
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["content"] = text or None  # OpenAI: null beside tool calls
                message["tool_calls"] = [whole_call(call) for call in tool_calls]
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(logprobs, self.token_bytes)
                if self.want_logprobs
                else None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": echo_prefix + text,
                "logprobs": completion_logprobs(logprobs, len(echo_prefix))
                if self.want_logprobs
                else None,
                "finish_reason": finish_reason,
            }
        return {
            **self._head(whole=True),
            "choices": [choice],
            "usage": usage(metrics, prompt_tokens, completion_tokens, self.dropped_messages),
            "timings": timings(metrics),
        }

    # -- stream chunks -------------------------------------------------------------------------

    def first_chunk(self, echo_prefix: str = "") -> dict[str, Any] | None:
        """Chat streams open with the assistant role; completion streams with the echo, if any."""
        if self.kind == "chat":
            return self._chunk({"role": "assistant", "content": ""}, None, None)
        if echo_prefix:
            self._text_pos += len(echo_prefix)
            return self._chunk(echo_prefix, None, None)
        return None

    def delta_chunks(
        self, deltas: Sequence[StreamDelta], logprobs: Sequence[TokenLogprob]
    ) -> list[dict[str, Any]]:
        """The chunks for one engine event: its content and tool-call deltas in order. Its
        logprobs ride on the first content chunk, or on an empty one when the event showed no
        text (held back, or part of a tool call)."""
        chunks: list[dict[str, Any]] = []
        pending: Sequence[TokenLogprob] = logprobs
        for delta in deltas:
            if isinstance(delta, ContentDelta):
                chunk = self.delta_chunk(delta.text, pending)
                pending = ()
            elif isinstance(delta, ReasoningDelta):
                chunk = (
                    None
                    if self.kind != "chat"
                    else self._chunk({"reasoning_content": delta.text}, None, None)
                )
            else:
                chunk = self._chunk({"tool_calls": [call_delta(delta)]}, None, None)
            if chunk is not None:
                chunks.append(chunk)
        if pending:
            chunk = self.delta_chunk("", pending)
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def delta_chunk(self, text: str, logprobs: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """One content delta; None when there is nothing to send (text held back by the
        detokenizer for a possible stop string or an unfinished UTF-8 character)."""
        if not text and not (self.want_logprobs and logprobs):
            return None
        lp = None
        if self.want_logprobs:
            if self.kind == "chat":
                lp = chat_logprobs(logprobs, self.token_bytes)
            else:
                lp = completion_logprobs(logprobs, self._text_pos)
        self._text_pos += len(text)
        delta: Any = {"content": text} if self.kind == "chat" else text
        return self._chunk(delta, None, lp)

    def content_sse(self, text: str) -> bytes:
        """``sse(delta_chunk(text, ()))`` for a non-empty ``text``, byte for byte, without building
        and encoding the whole chunk: every content chunk of a stream differs only in its text,
        so the rest is encoded once. A streamed token costs the event loop this, on the cores
        the compute threads run on."""
        if self._content_parts is None:
            self._content_parts = _split_around(self._content_chunk(CONTENT_MARKER))
        self._text_pos += len(text)
        if not self._content_parts:  # a fixed field holds the marker: encode the whole chunk
            return sse(self._content_chunk(text))
        head, tail = self._content_parts
        return head + json.dumps(text).encode() + tail

    def _content_chunk(self, text: str) -> dict[str, Any]:
        return self._chunk({"content": text} if self.kind == "chat" else text, None, None)

    def finish_chunk(self, finish_reason: str, metrics: RequestMetrics | None) -> dict[str, Any]:
        chunk = self._chunk({} if self.kind == "chat" else "", finish_reason, None)
        chunk["timings"] = timings(metrics)
        return chunk

    def usage_chunk(
        self, metrics: RequestMetrics | None, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        return {
            **self._head(whole=False),
            "choices": [],
            "usage": usage(metrics, prompt_tokens, completion_tokens, self.dropped_messages),
        }

    # -- shared parts ----------------------------------------------------------------------------

    def _head(self, *, whole: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion" if whole else "chat.completion.chunk"
        else:
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def _chunk(self, delta: Any, finish_reason: str | None, logprobs: Any) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "delta": delta, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": delta, "logprobs": logprobs}
        choice["finish_reason"] = finish_reason
        chunk = {**self._head(whole=False), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk


# Stands for the text while a content chunk's template is encoded: no id, model name or fixed
# field holds it, and _split_around checks that it occurs exactly once.
CONTENT_MARKER = "\ue000localinfer content\ue000"


def _split_around(chunk: dict[str, Any]) -> tuple[bytes, ...]:
    """The chunk's SSE bytes before and after its text (the marker); () if that is ambiguous."""
    whole = sse(chunk)
    marker = json.dumps(CONTENT_MARKER).encode()
    if whole.count(marker) != 1:
        return ()
    head, _, tail = whole.partition(marker)
    return head, tail


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
            reasoning=answer.reasoning,
        )

    def opening(self) -> list[bytes]:
        head = self.builder.first_chunk(self.echo)
        return [] if head is None else [sse(head)]

    def deltas(
        self, deltas: Sequence[StreamDelta], logprobs: Sequence[TokenLogprob]
    ) -> list[bytes]:
        builder = self.builder
        if not builder.want_logprobs and all(type(d) is ContentDelta for d in deltas):
            # The common token: text only. Without logprobs asked for, an event's logprobs
            # never reach a chunk (delta_chunks), so this is the same list of messages.
            return [builder.content_sse(d.text) for d in deltas if d.text]
        return [sse(chunk) for chunk in builder.delta_chunks(deltas, logprobs)]

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
