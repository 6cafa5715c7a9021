"""The seam the chat streams answers through, and what the app asks of whoever answers.

Two implementations: :class:`~localinfer.tui.host.ChatHost` answers with a session loaded in
this process (the engine's own StreamEvents), :class:`~localinfer.tui.remote_host.RemoteHost`
with a running `localinfer serve` (its OpenAI-compatible stream, turned into StreamEvents). The
app's answer worker and the stream pump see only :class:`AnswerSource`; the rest of
:class:`ChatBackend` is the model's lifetime, which the remote host mostly declines.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from localinfer.errors import LocalinferError

if TYPE_CHECKING:
    from localinfer.engine.images import RGBImage
    from localinfer.engine.types import EngineMetrics, SamplingParams, StreamEvent
    from localinfer.tools.thinking import Thinking
    from localinfer.tui.chat_images import ChatImages
    from localinfer.tui.memory_figures import MemoryFigures
    from localinfer.tui.model_list import ModelChoice
    from localinfer.tui.settings import ChatSettings
    from localinfer.tui.think_switch import ThinkingSupport


@dataclass(slots=True, frozen=True)
class PreparedPrompt:
    """One request's prompt: the messages, and their token ids where this process tokenizes."""

    messages: list[dict[str, str]]
    prompt_ids: list[int] = field(default_factory=list)  # empty: the server tokenizes
    reasoning: Any = None  # a thinking model's ReasoningSpec (engine/reasoning.py), or None
    thinking: Thinking | None = None  # what was asked of a thinking model (None: its default)
    images: tuple[Any, ...] = ()  # the prompt's images (engine PromptImage), for the Request

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class AnswerSource(Protocol):
    """Where an answer comes from. ``prepare`` and ``stream`` block (call them from a worker);
    either raises before any token when the request is refused."""

    def prepare(
        self, messages: Sequence[dict[str, str]], thinking: Thinking | None = None
    ) -> PreparedPrompt: ...

    def stream(
        self, prompt: PreparedPrompt, params: SamplingParams, request_id: str
    ) -> Iterable[StreamEvent]: ...  # the last event has finish_reason set

    def abort(self, request_id: str) -> bool: ...

    def engine_metrics(self) -> EngineMetrics | None: ...


class ChatBackend(AnswerSource, Protocol):
    """Everything the chat app asks of its host."""

    settings: ChatSettings
    ui_started: threading.Event
    remote_url: str | None  # None: the model is loaded in this process
    images: ChatImages  # the conversation's attached images (chat_images.py)

    @property
    def loaded(self) -> bool: ...

    def model_name(self) -> str: ...

    def notice(self) -> str | None: ...

    def describe(self) -> str: ...

    def load(self, settings: ChatSettings) -> None: ...

    def close(self) -> None: ...

    def memory(self) -> MemoryFigures: ...

    def persist_kv(self, messages: Sequence[dict[str, str]]) -> int: ...

    def model_choices(self, ctx: int | None = None) -> list[ModelChoice]: ...

    def thinking_support(self) -> ThinkingSupport: ...

    def image_tokens(self, image: RGBImage) -> int: ...


class HintedError(LocalinferError):
    """A failure that knows what the user can do next (the chat shows both)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint
