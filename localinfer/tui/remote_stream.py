"""A server's streamed chat completion as the engine's StreamEvents, and its refusals as one line.

`localinfer serve` streams OpenAI ``chat.completion.chunk`` events: the assistant's role, text
deltas (a thinking model's reasoning in ``reasoning_content``, llama-server's and vLLM's name),
a chunk with ``finish_reason``, the ``usage`` chunk (asked for with
``stream_options.include_usage``) and ``[DONE]``. :class:`RemoteAnswer` hands the stream pump a
StreamEvent per text delta and one final event whose metrics are measured here, where the text
arrives: time to first token is the pump's, the decode rate spans the first to the last delta
over the server's count of tokens. A stream that breaks off ends with an ``error`` event, after
the text that did arrive.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from localinfer.engine.metrics import DecodePace
from localinfer.engine.types import FinishReason, RequestMetrics, StreamEvent
from localinfer.sse_decoder import DONE, sse_events
from localinfer.tui.answer_source import HintedError

SERVE_HINT = "start `localinfer serve` there, or check --url"
KEY_HINT = "pass the server's key with --api-key KEY"


def unreachable(url: str, exc: Exception) -> HintedError:
    reason = str(exc) or type(exc).__name__
    return HintedError(f"cannot reach {url} ({reason})", SERVE_HINT)


def error_message(response: httpx.Response) -> str:
    """The server's own words for a refusal (OpenAI's ``{"error": {"message"}}``), else the
    status line."""
    try:
        body = json.loads(response.read())
    except (ValueError, httpx.HTTPError):
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"].rstrip(". ")
    if isinstance(error, str):
        return error.rstrip(". ")
    return f"HTTP {response.status_code} {response.reason_phrase}".rstrip()


def refusal(url: str, response: httpx.Response) -> HintedError:
    """A non-2xx answer as one line and what to do next (404s are worded by the host, which
    knows what is served)."""
    message = error_message(response)
    if response.status_code == 401:
        return HintedError(f"{url} refused the request: {message}", KEY_HINT)
    if response.status_code in (400, 413, 422):
        return HintedError(message, "shorten the message, or start a new conversation (Ctrl+N)")
    if response.status_code in (429, 503):
        return HintedError(f"{url} is busy: {message}", "try again in a moment")
    return HintedError(f"{url} answered {response.status_code}: {message}", SERVE_HINT)


def _finish(value: Any) -> FinishReason:
    # Tool calls and filters end an answer as a stop does; the chat sends no tools.
    return value if value in ("stop", "length", "abort", "error") else "stop"


class RemoteAnswer:
    """One streaming chat completion: iterate it once (a worker), :meth:`stop` from any thread."""

    def __init__(
        self,
        request_id: str,
        response: httpx.Response,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request_id = request_id
        self._response = response
        self._clock = clock
        self._stopped = threading.Event()
        self._first: float | None = None
        self._last: float | None = None

    def stop(self) -> None:
        """End the answer: closing the stream is how a server learns the client went away
        (it aborts the request)."""
        self._stopped.set()
        self._response.close()

    def __iter__(self) -> Iterator[StreamEvent]:
        finish: FinishReason | None = None
        usage: dict[str, Any] | None = None
        try:
            for data in sse_events(self._response.iter_text()):
                if data == DONE or self._stopped.is_set():
                    break
                if not data.strip():
                    continue  # a bare ``data:`` line: an event with nothing in it
                chunk = json.loads(data)
                if isinstance(chunk.get("error"), dict):
                    message = str(chunk["error"].get("message", "unknown error"))
                    yield self._end("error", None, f"the server failed: {message.rstrip('. ')}")
                    return
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text, thought = delta.get("content") or "", delta.get("reasoning_content")
                    if text or thought:
                        yield self._delta(text, thought if isinstance(thought, str) else "")
                    if choice.get("finish_reason"):
                        finish = _finish(choice["finish_reason"])
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
        except (httpx.HTTPError, OSError, ValueError) as exc:
            if not self._stopped.is_set():
                reason = str(exc) or type(exc).__name__
                yield self._end("error", usage, f"the server dropped the stream ({reason})")
                return
        finally:
            self._response.close()
        if self._stopped.is_set() and finish is None:
            yield self._end("abort", usage, None)
        elif finish is None:
            yield self._end("error", usage, "the server ended the stream before the answer")
        else:
            yield self._end(finish, usage, None)

    def _delta(self, text: str, reasoning: str = "") -> StreamEvent:
        now = self._clock()
        if self._first is None:
            self._first = now
        self._last = now
        return StreamEvent(self.request_id, text, (), reasoning=reasoning)

    def _end(
        self, reason: FinishReason, usage: dict[str, Any] | None, error: str | None
    ) -> StreamEvent:
        return StreamEvent(self.request_id, "", (), reason, error, metrics=self._metrics(usage))

    def _metrics(self, usage: dict[str, Any] | None) -> RequestMetrics | None:
        """The server's token counts with the decode rate measured here; None without counts
        (the pump's own figures stand). TTFT stays the pump's: it timed the request's start."""
        if usage is None:
            return None
        completion = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        # A thinking model's reasoning tokens, under OpenAI's name (of the completion tokens).
        reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        pace = DecodePace.between(self._first, self._last, completion)
        return RequestMetrics(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=completion,
            cached_tokens=int(details.get("cached_tokens") or 0),
            tpot_s=pace.tpot_s if pace is not None else None,
            decode_tps=pace.tokens_per_s if pace is not None else None,
            reasoning_tokens=int(reasoning or 0),
        )
