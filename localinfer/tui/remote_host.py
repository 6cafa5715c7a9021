"""`localinfer chat --url URL`: the chat's host when a running `localinfer serve` answers.

The chat then loads nothing: "loading" is attaching (the server's model list, checked for the
model asked for), answers stream from ``/v1/chat/completions``, the engine figures come from
``/metrics`` (read in a thread of their own while answers stream: remote_poll.py) and the memory
panel from what ``/v1/models`` says of the model, if anything (read again only once the last
reading is ``MEMORY_MAX_AGE_S`` old). What needs a model in this process (the picker, a reload
for context or slots) says why it is not available. Every call but ``engine_metrics`` may block;
the app makes them from workers, as it does the local host's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from localinfer.engine.types import EngineMetrics, SamplingParams, StreamEvent
from localinfer.errors import LocalinferError
from localinfer.tui.answer_source import HintedError, PreparedPrompt
from localinfer.tui.chat_images import ChatImages, has_images
from localinfer.tui.memory_figures import MemoryFigures
from localinfer.tui.model_list import ModelChoice
from localinfer.tui.remote_metrics import engine_metrics_from
from localinfer.tui.remote_poll import MetricsPoller
from localinfer.tui.remote_stream import RemoteAnswer, error_message, refusal, unreachable
from localinfer.tui.settings import RELOAD_FIELDS, ChatSettings
from localinfer.tui.think_switch import UNKNOWN, ThinkingSupport

if TYPE_CHECKING:
    from localinfer.engine.images import RGBImage
    from localinfer.tools.thinking import Thinking

CONNECT_TIMEOUT_S = 5.0
# A big prompt's prefill may keep the first byte waiting long; Esc stops a wait sooner.
READ_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 2.0  # /metrics and /v1/models for the side panels
# The model's budget, state and device change only when the server reloads it: the memory bar,
# refreshed after every answer, re-reads /v1/models no more often than this.
MEMORY_MAX_AGE_S = 30.0


class RemoteHost:
    """Answers from the server at ``url``; thread-safe for the app's pattern."""

    def __init__(
        self,
        url: str,
        settings: ChatSettings | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.remote_url = url.rstrip("/")
        self.settings = settings or ChatSettings()
        self.ui_started = threading.Event()
        self.images = ChatImages()  # never sent: the chat attaches none over --url (prepare)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.remote_url,
            headers=headers,
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            transport=transport,
        )
        self._model: str | None = None
        self._card: dict[str, Any] = {}
        self._clock = clock
        self._card_read_at = float("-inf")  # when /v1/models last said what _card says
        self._poller = MetricsPoller(self._read_metrics)
        self._answers: dict[str, RemoteAnswer] = {}
        self._lock = threading.Lock()

    # -- attaching ---------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self, settings: ChatSettings) -> None:
        """Attach: read the server's models and pick the one asked for (or the first one)."""
        if self._model is not None and _needs_this_process(self.settings, settings):
            # Context, slots, backend... are the server's; only the model name could change.
            raise HintedError(
                f"the model is served by {self.remote_url}: its context, slots and backend are "
                "set where `localinfer serve` runs",
                "change them there, or run the chat without --url",
            )
        cards = self.served_models()
        wanted = settings.model
        card = _pick(cards, wanted)
        if card is None:
            raise self._not_served(wanted, [c["id"] for c in cards])
        self._model, self._card = card["id"], card
        self._card_read_at = self._clock()
        self.settings = settings
        self._poller.poll_now()  # the engine panel's first figures, before any answer

    def served_models(self) -> list[dict[str, Any]]:
        """The server's ``/v1/models`` entries (raises HintedError when it cannot tell)."""
        try:
            response = self._client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise unreachable(self.remote_url, exc) from None
        if response.status_code != 200:
            raise refusal(self.remote_url, response)
        try:
            data = response.json().get("data")
        except ValueError:
            data = None
        if not isinstance(data, list):
            raise HintedError(
                f"{self.remote_url} is no OpenAI-compatible server (no model list)",
                "point --url at `localinfer serve`",
            )
        return [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]

    def _not_served(self, wanted: str | None, served: list[str]) -> HintedError:
        listed = ", ".join(served) if served else "nothing"
        return HintedError(
            f"model '{wanted}' is not served at {self.remote_url}; it serves {listed}",
            "name one of those after --url, or none for the server's own",
        )

    def close(self) -> None:
        with self._lock:
            answers = list(self._answers.values())
        for answer in answers:
            answer.stop()
        self._poller.close()
        self._client.close()

    def model_name(self) -> str:
        if self._model is None:
            raise LocalinferError(f"not attached to {self.remote_url} yet")
        return self._model

    def notice(self) -> str | None:
        return f"Answers come from {self.remote_url} (`localinfer serve`)."

    def describe(self) -> str:
        parts = [self.model_name(), f"served by {self.remote_url}"]
        meta = self._card.get("meta")
        if isinstance(meta, dict) and meta.get("backend"):
            parts.append(str(meta["backend"]))
        if self._card.get("max_model_len"):
            parts.append(f"ctx {self._card['max_model_len']}")
        return " · ".join(parts)

    def persist_kv(self, messages: Sequence[dict[str, str]]) -> int:
        return 0  # the server's KV tiers are its own business (`serve --kv-disk`)

    def model_choices(self, ctx: int | None = None) -> list[ModelChoice]:
        raise HintedError(
            f"the model is chosen where `localinfer serve` runs ({self.remote_url})",
            "name a served model after --url, or run the chat without --url to load one here",
        )

    # -- answering ---------------------------------------------------------------------------

    def prepare(
        self, messages: Sequence[dict[str, str]], thinking: Thinking | None = None
    ) -> PreparedPrompt:
        if has_images(messages):  # their tags would reach the server as text
            raise HintedError(
                "the chat sends no images to a server (--url) yet",
                "start a new conversation (Ctrl+N), or run the chat without --url",
            )
        # The server templates and tokenizes. Earlier reasoning is not sent back: the templates
        # that keep it (Qwen3's) keep it only inside a tool loop, which the chat never is.
        sent = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
        return PreparedPrompt(sent, thinking=thinking)

    def thinking_support(self) -> ThinkingSupport:
        return UNKNOWN  # the server's template is not read here; it applies what is asked

    def image_tokens(self, image: RGBImage) -> int:
        raise HintedError(
            "the chat attaches images only to a model it loads (not over --url) yet",
            "run the chat without --url to attach images",
        )

    def stream(
        self, prompt: PreparedPrompt, params: SamplingParams, request_id: str
    ) -> Iterable[StreamEvent]:
        body = {
            "model": self.model_name(),
            "messages": prompt.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **_thinking_fields(prompt.thinking),
        }
        request = self._client.build_request("POST", "/v1/chat/completions", json=body)
        # Figures from the request on: `serve` sends its headers after the prefill.
        self._poller.begin()
        try:
            answer = RemoteAnswer(request_id, self._send(request))
        except BaseException:
            self._poller.end()
            raise
        with self._lock:
            self._answers[request_id] = answer
        return _PolledAnswer(answer, self._poller, self._forget)

    def _send(self, request: httpx.Request) -> httpx.Response:
        """The streaming response, its headers read; HintedError when it is refused."""
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise unreachable(self.remote_url, exc) from None
        if response.status_code != 200:
            try:
                raise self._refused(response)
            finally:
                response.close()
        return response

    def _refused(self, response: httpx.Response) -> HintedError:
        if response.status_code == 404:
            error_message(response)  # read the body before the connection goes back
            try:
                served = [c["id"] for c in self.served_models()]
            except HintedError:
                served = []
            return self._not_served(self._model, served)
        return refusal(self.remote_url, response)

    def _forget(self, answer: RemoteAnswer) -> None:
        with self._lock:
            if self._answers.get(answer.request_id) is answer:
                del self._answers[answer.request_id]

    def abort(self, request_id: str) -> bool:
        with self._lock:
            answer = self._answers.get(request_id)
        if answer is None:
            return False
        answer.stop()
        return True

    def engine_metrics(self) -> EngineMetrics | None:
        """The server's engine figures as last read from ``/metrics`` (None when it does not
        say). Never waits on the server: the stream pump calls it between tokens."""
        return self._poller.latest()

    def _read_metrics(self) -> EngineMetrics | None:
        """None when the server has no figures to give; raises (httpx.HTTPError) when the read
        failed, so the poller keeps the last good figures."""
        response = self._client.get("/metrics", timeout=PROBE_TIMEOUT_S)
        if response.status_code == 404:
            return None  # a server without a metrics page
        response.raise_for_status()
        return engine_metrics_from(response.text, self._model)

    def memory(self) -> MemoryFigures:
        """What ``/v1/models`` says of the model (its budget's total, state and device, where
        the server lists them); always names the server."""
        served_by = f"served by {self.remote_url}"
        card = self._card
        if self._clock() - self._card_read_at >= MEMORY_MAX_AGE_S:
            try:
                cards = self.served_models()
            except HintedError:
                return MemoryFigures(served_by=served_by)
            card = _pick(cards, self._model) or {}
            if card:  # a model gone from the list is asked about again next time
                self._card, self._card_read_at = card, self._clock()
        budget = card.get("budget_bytes")
        device = card.get("device")
        return MemoryFigures(
            device=device if isinstance(device, str) else "",
            served_by=served_by,
            served_budget=budget if isinstance(budget, int) and budget >= 0 else None,
            served_state=str(card["state"]) if card.get("state") else None,
        )


class _PolledAnswer:
    """A streaming answer that keeps the poller reading ``/metrics`` (begun by ``stream``) until
    it ends: ``close`` ends the polling once and lets the connection go. It runs at the end of
    the iteration, when an iteration abandoned half way is closed or collected, and when this
    object is collected never iterated: no answer leaves the poller running."""

    def __init__(
        self,
        answer: RemoteAnswer,
        poller: MetricsPoller,
        forget: Callable[[RemoteAnswer], None],
    ) -> None:
        self._answer = answer
        self._poller = poller
        self._forget = forget
        self._lock = threading.Lock()
        self._iterated = False
        self._closed = False

    def __iter__(self) -> Iterator[StreamEvent]:
        with self._lock:
            if self._closed or self._iterated:
                return  # a response is read once
            self._iterated = True
        try:
            yield from self._answer
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._answer.stop()  # after a whole answer it closes what is closed already
        self._forget(self._answer)
        self._poller.end()

    def __del__(self) -> None:
        self.close()


def _thinking_fields(thinking: Thinking | None) -> dict[str, Any]:
    """The request's thinking for `localinfer serve` (a model that does not think ignores it)."""
    if thinking is None:
        return {}
    fields: dict[str, Any] = {}
    if thinking.enabled is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": thinking.enabled}
    if thinking.budget is not None:
        fields["thinking_budget"] = thinking.budget
    return fields


def _needs_this_process(before: ChatSettings, after: ChatSettings) -> bool:
    """Whether going from ``before`` to ``after`` changes what only the server sets (all the
    reload fields but the model's name: the server may serve others)."""
    return any(getattr(before, f) != getattr(after, f) for f in RELOAD_FIELDS - {"model"})


def _pick(cards: list[dict[str, Any]], wanted: str | None) -> dict[str, Any] | None:
    """The card named ``wanted``; without a name, the first loaded one (else the first)."""
    if wanted is not None:
        return next((c for c in cards if c["id"] == wanted), None)
    loaded = [c for c in cards if c.get("state") in (None, "loaded")]
    return (loaded or cards or [None])[0]
