"""What the load generator drives: one streamed request at a time against an OpenAI-compatible
HTTP server or the engine in this process, timed the same way.

TTFT is the time to the first output (text for HTTP, a token for the engine); TPOT is spread over
the tokens after it. HTTP servers count output tokens in their usage chunk when they send one
(``stream_options.include_usage``); llama-cpp-python's server does not, so then each streamed
text chunk counts as one token (such servers send one chunk per token).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from localinfer.bench.prompts import BenchPrompt
from localinfer.bench.records import RequestRecord, TokenSource
from localinfer.bench.sse import sse_data
from localinfer.errors import InvalidParameterError, LocalinferError

if TYPE_CHECKING:
    from localinfer.session import Session


class Target(Protocol):
    name: str  # shown in the report
    model: str

    async def run(self, prompt: BenchPrompt, max_tokens: int) -> RequestRecord: ...

    async def aclose(self) -> None: ...


def api_base(url: str) -> str:
    """'http://host:8000', '.../v1' or '.../v1/' -> 'http://host:8000/v1'."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InvalidParameterError(f"--url wants http(s)://HOST:PORT, got '{url}'")
    return url if url.endswith("/v1") else url + "/v1"


class HttpTarget:
    """Streaming chat completions against an OpenAI-compatible server; with ``completions``,
    text completions (/v1/completions) of the prompt's message contents as raw text, so servers
    that apply different chat templates (or a model that has none) get the same prompt."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        extra_body: dict[str, Any] | None = None,
        concurrency: int = 8,
        timeout_s: float = 600.0,
        completions: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: httpx.MockTransport
    ) -> None:
        self.base = api_base(url)
        self.name = self.base
        self.model = model or ""
        self.extra_body = dict(extra_body or {})
        self.completions = completions
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(
            max_connections=concurrency + 4, max_keepalive_connections=concurrency
        )
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=limits,
            transport=transport,
        )

    async def resolve_model(self) -> str:
        """The served model's id (the first of /v1/models) unless one was given."""
        if self.model:
            return self.model
        try:
            response = await self._client.get(self.base + "/models")
        except httpx.TransportError as exc:
            raise LocalinferError(
                f"cannot reach {self.base}: {exc or type(exc).__name__}"
            ) from None
        if response.status_code != 200:
            raise LocalinferError(f"{self.base}/models answered HTTP {response.status_code}")
        models = response.json().get("data") or []
        if not models:
            raise LocalinferError(f"{self.base}/models lists no model; pass --model-name")
        self.model = str(models[0]["id"])
        return self.model

    async def run(self, prompt: BenchPrompt, max_tokens: int) -> RequestRecord:
        if self.completions:
            path = "/completions"
            content: dict[str, Any] = {"prompt": raw_prompt(prompt)}
        else:
            path, content = "/chat/completions", {"messages": list(prompt.messages)}
        body = {
            "model": self.model,
            **content,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }
        start = time.perf_counter()
        ttft = last = None
        chunks = 0
        usage_tokens: int | None = None
        prompt_tokens: int | None = None
        finished = False

        def failed(error: str) -> RequestRecord:
            return RequestRecord(prompt.id, False, time.perf_counter() - start, ttft, last,
                                 chunks, error=error)  # fmt: skip

        try:
            async with self._client.stream("POST", self.base + path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return failed(f"HTTP {response.status_code}: {_error_text(response)}")
                async for data in sse_data(response.aiter_lines()):
                    if data.strip() == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        return failed(f"stream error: {_message(chunk['error'])}")
                    usage = chunk.get("usage")
                    if usage and usage.get("completion_tokens") is not None:
                        usage_tokens = int(usage["completion_tokens"])
                        prompt_tokens = usage.get("prompt_tokens")
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        text = delta.get("content") or delta.get("reasoning_content") or ""
                        text = text or choice.get("text") or ""
                        if text:
                            now = time.perf_counter() - start
                            ttft = now if ttft is None else ttft
                            last = now
                            chunks += 1
                        finished = finished or choice.get("finish_reason") is not None
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            return failed(f"{type(exc).__name__}: {exc}".rstrip(": "))
        if not finished:
            return failed("stream ended without a finish_reason")
        tokens, source = (usage_tokens, "usage") if usage_tokens is not None else (chunks, "chunks")
        source_t: TokenSource = source  # type: ignore[assignment]
        return RequestRecord(prompt.id, True, time.perf_counter() - start, ttft, last, tokens,
                             source_t, prompt_tokens)  # fmt: skip

    async def aclose(self) -> None:
        await self._client.aclose()


def raw_prompt(prompt: BenchPrompt) -> str:
    """The prompt's message contents as one text (a blank line between messages)."""
    return "\n\n".join(m["content"] for m in prompt.messages)


def _error_text(response: httpx.Response) -> str:
    try:
        return _message(response.json().get("error")) or response.text[:200]
    except (json.JSONDecodeError, AttributeError):
        return response.text[:200]


def _message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


class EngineTarget:
    """The engine of a Session in this process: the same work as `serve`, no HTTP in between."""

    def __init__(self, session: Session, *, ignore_eos: bool = False) -> None:
        self.session = session
        self.model = session.model.name
        self.name = f"in-process {self.model} ({session.backend})"
        self.ignore_eos = ignore_eos
        self._ids: dict[str, list[int]] = {}  # prompt id -> token ids (tokenize once)

    def prompt_ids(self, prompt: BenchPrompt) -> list[int]:
        ids = self._ids.get(prompt.id)
        if ids is None:
            ids = self.session.chat_prompt_ids(list(prompt.messages))
            self._ids[prompt.id] = ids
        return ids

    async def run(self, prompt: BenchPrompt, max_tokens: int) -> RequestRecord:
        from localinfer.engine.types import Request, SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=self.ignore_eos)
        ids = self.prompt_ids(prompt)
        start = time.perf_counter()
        ttft = last = None
        tokens = 0
        try:
            async for event in self.session.engine.stream(Request(ids, params)):
                if event.token_ids:
                    now = time.perf_counter() - start
                    ttft = now if ttft is None else ttft
                    last = now
                    tokens += len(event.token_ids)
                if event.finish_reason in ("error", "abort"):
                    error = event.error or event.finish_reason
                    return RequestRecord(prompt.id, False, time.perf_counter() - start, ttft,
                                         last, tokens, "events", len(ids), error)  # fmt: skip
        except LocalinferError as exc:  # a full queue, a prompt longer than the context
            return RequestRecord(prompt.id, False, time.perf_counter() - start, error=str(exc))
        return RequestRecord(prompt.id, True, time.perf_counter() - start, ttft, last, tokens,
                             "events", len(ids))  # fmt: skip

    async def aclose(self) -> None:
        return None


def longest_prompt(target: EngineTarget, prompts: Sequence[BenchPrompt]) -> int:
    return max(len(target.prompt_ids(p)) for p in prompts)
