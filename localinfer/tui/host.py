"""The chat app's one door to the model: session, engine, budget and catalog.

The Textual app never imports the engine, the loaders or the budget; it calls a :class:`ChatHost`
from worker threads and renders the plain dataclasses it returns. Tests build a host around a real
(small) session; ``localinfer chat`` builds one that opens the model named on the command line.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from localinfer.errors import LocalinferError
from localinfer.tui.answer_source import PreparedPrompt
from localinfer.tui.chat_images import ChatImages, has_images, image_tokens
from localinfer.tui.memory_figures import MemoryFigures, MemoryParts
from localinfer.tui.model_list import ModelChoice, list_model_choices
from localinfer.tui.settings import ChatSettings
from localinfer.tui.think_switch import ThinkingSupport, support_from_template

__all__ = ["ChatHost", "MemoryFigures", "MemoryParts", "ModelChoice", "open_with_settings"]

if TYPE_CHECKING:  # the engine package is heavy; `localinfer chat` imports it in the preload
    from localinfer.budget.measured import LoadGrowth
    from localinfer.engine.images import RGBImage
    from localinfer.engine.types import EngineMetrics, Request, SamplingParams
    from localinfer.kv_options import KVTierOptions
    from localinfer.rpc_nodes import RpcOptions
    from localinfer.tools.thinking import Thinking


class EngineLike(Protocol):
    def submit(self, request: Request) -> Any: ...  # an iterable of StreamEvent

    def abort(self, request_id: str) -> bool: ...

    def metrics(self) -> EngineMetrics: ...


class SessionLike(Protocol):
    """What localinfer.session.Session offers the chat."""

    engine: EngineLike
    model: Any  # LoadedModel: .name, .config, .tokenizer, .chat_template
    runner_notice: str | None

    def chat_prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def close(self) -> None: ...


Opener = Callable[[ChatSettings], SessionLike]

# How long a preload waits for the window to come up before loading anyway (load_in_background).
UI_START_WAIT_S = 10.0


@dataclass(slots=True, frozen=True)
class _Opened:
    session: SessionLike
    growth: LoadGrowth | None  # the process's RSS growth over the load


def open_with_settings(
    settings: ChatSettings,
    *,
    force: bool = False,
    kv: KVTierOptions | None = None,
    kv_dtype: str | None = None,
    rpc: RpcOptions | None = None,
) -> SessionLike:
    """Open a session the way `localinfer chat` does (imports the engine stack on first call);
    ``force``: load even what the budget says does not fit (`chat --force`); ``kv``: the KV
    tiers (--kv-ram/--kv-disk), where a closed conversation's KV is kept; ``kv_dtype``: the
    cache's element type (`chat --kv-dtype`)."""
    from localinfer.session import open_session

    draft = {"off": None, "ngram": "ngram", "draft": settings.draft}[settings.speculative]
    sizes = {name: getattr(settings, name) for name in ("backend", "ctx", "slots", "threads")}
    return open_session(
        settings.model,
        quant=settings.quant,
        draft=draft,
        force=force,
        kv=kv,
        kv_dtype=kv_dtype,
        rpc=rpc,  # `chat --rpc`: the model split across machines (rpc_nodes.py)
        cache_reuse=settings.chunk_reuse,  # a cut's kept turns keep their KV (#39)
        **sizes,
    )


class ChatHost:
    """Owns the current session; thread-safe for the app's pattern (one worker at a time each).

    The chat's local :class:`~localinfer.tui.answer_source.ChatBackend`: answers stream from the
    session's engine in this process.
    """

    remote_url: str | None = None

    def __init__(
        self,
        settings: ChatSettings | None = None,
        session: SessionLike | None = None,
        opener: Opener = open_with_settings,
    ) -> None:
        self.settings = settings or ChatSettings()
        self._session = session
        self._opener = opener
        self._lock = threading.Lock()
        self._pending: tuple[ChatSettings, Future[_Opened]] | None = None
        self._growth: LoadGrowth | None = None  # of the current session's load
        # Set by the app once its window is up: a preload measures its memory growth after it.
        self.ui_started = threading.Event()
        self.images = ChatImages()  # the conversation's attached images (chat_images.py)

    # -- model lifetime ---------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._session is not None

    @property
    def session(self) -> SessionLike:
        if self._session is None:
            raise LocalinferError("no model is loaded yet; wait for loading to finish")
        return self._session

    def load_in_background(self, settings: ChatSettings) -> None:
        """Start opening ``settings`` in a thread now; the next :meth:`load` collects it.

        `localinfer chat` calls this before importing Textual. The thread opens the model once
        the app's window is up (:attr:`ui_started`, or after ``UI_START_WAIT_S``): the memory
        panel shows the process's growth from loading the model, and the window's own memory
        (Textual's import and first layout, ~60 MiB) growing in the same span would be counted
        as the model's.
        """
        future: Future[_Opened] = Future()

        def open_now() -> None:
            self.ui_started.wait(UI_START_WAIT_S)
            try:
                future.set_result(self._open(settings))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever calls load()
                future.set_exception(exc)

        self._pending = (settings, future)
        threading.Thread(target=open_now, name="localinfer-preload", daemon=True).start()

    def _open(self, settings: ChatSettings) -> _Opened:
        """Open ``settings``, reading the process's RSS around it."""
        from localinfer.budget.measured import GrowthProbe

        probe = GrowthProbe(settings.backend)
        session = self._opener(settings)
        return _Opened(session, probe.finish())

    def _adopt(self, opened: _Opened, settings: ChatSettings) -> None:
        self._session, self._growth = opened.session, opened.growth
        self.settings = settings

    def _collect_pending(self, settings: ChatSettings) -> bool:
        """Adopt a background load of ``settings`` (True), or discard a different one."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        wanted, future = pending
        if wanted != settings:
            with contextlib.suppress(Exception):
                future.result().session.close()
            return False
        self._adopt(future.result(), settings)  # raises the load's error
        return True

    def load(self, settings: ChatSettings) -> None:
        """Open a session for ``settings`` (blocking; call from a worker).

        The old model is closed first so two never compete for memory; if the new one fails, the
        old settings are reopened and the original error is raised.
        """
        with self._lock:
            if self._session is None and self._collect_pending(settings):
                return
            previous, old = self.settings, self._session
            if old is not None:
                self._session, self._growth = None, None
                old.close()
            try:
                self._adopt(self._open(settings), settings)
            except Exception:
                if old is not None:
                    try:
                        self._adopt(self._open(previous), previous)
                    except Exception:  # noqa: BLE001 - the first error is the one to report
                        self._session = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._pending is not None:
                # Don't wait for a load nobody will use: close it whenever it finishes.
                _, future = self._pending
                self._pending = None
                future.add_done_callback(_close_result)
            if self._session is not None:
                self._session.close()
                self._session = None

    def describe(self) -> str:
        session = self.session
        info = getattr(getattr(getattr(session, "engine", None), "runner", None), "info", None)
        parts = [session.model.name]
        if info is not None:
            parts.append(f"{info.backend} {info.quant}")
            parts.append(f"ctx {info.max_ctx} × {info.slots} slots")
        return " · ".join(parts)

    def model_name(self) -> str:
        return str(self.session.model.name)

    def notice(self) -> str | None:
        session = self.session
        # The runner's choice, and why KV tiers asked for are off (when they are).
        notices = [getattr(session, "runner_notice", None)]
        notices.append(getattr(getattr(session, "tiers", None), "notice", None))
        return " · ".join(n for n in notices if n) or None

    def persist_kv(self, messages: Sequence[dict[str, str]]) -> int:
        """Keep the KV of the conversation ``messages`` in the session's KV tiers (the chat
        closes it); how many tokens were kept, 0 without tiers. Blocks: call from a worker."""
        session = self._session
        persist = getattr(session, "persist_kv", None)  # a session without tiers may lack it
        if session is None or persist is None:
            return 0
        # With images, the ids the answers were cached under: the projector's placeholders.
        ids = self.prepare(messages).prompt_ids if has_images(messages) else None
        return int(persist(ids or session.chat_prompt_ids(messages)))

    # -- answering ---------------------------------------------------------------------------

    def prepare(
        self, messages: Sequence[dict[str, str]], thinking: Thinking | None = None
    ) -> PreparedPrompt:
        """The prompt with thinking as asked (on or off, a budget: a thinking model's; None:
        its template's default), and its reasoning split (shown apart, folded); the messages'
        images tokenized by the model's projector (chat_images.py)."""
        from localinfer.tools.thinking import thinking_prompt

        session = self.session
        source, sent = self.images.chat_source(session, messages)
        prompt = thinking_prompt(source, sent, thinking)
        shown = () if source is session else tuple(source.images)
        return PreparedPrompt(list(messages), prompt.ids, prompt.reasoning, thinking, shown)

    def image_tokens(self, image: RGBImage) -> int:
        """The context an image takes on this model (its projector's count)."""
        return image_tokens(self.session, image)

    def thinking_support(self) -> ThinkingSupport:
        """Whether the loaded model thinks, and how it is switched (read off its template)."""
        template = getattr(self.session.model, "chat_template", None)
        return support_from_template(getattr(template, "source", None))

    def stream(self, prompt: PreparedPrompt, params: SamplingParams, request_id: str) -> Any:
        """The engine's StreamEvents for ``prompt`` (see :meth:`submit`)."""
        from localinfer.engine.types import Request

        return self.submit(Request(prompt.prompt_ids, params, request_id,
                                   reasoning=prompt.reasoning, images=prompt.images))  # fmt: skip

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.session.chat_prompt_ids(messages)

    def submit(self, request: Request) -> Any:
        """Start a request; the return value iterates StreamEvents (raises before any compute
        on context overflow or a bad parameter)."""
        return self.session.engine.submit(request)

    def abort(self, request_id: str) -> bool:
        session = self._session
        return session.engine.abort(request_id) if session is not None else False

    def engine_metrics(self) -> EngineMetrics | None:
        session = self._session
        return session.engine.metrics() if session is not None else None

    def sampling_params(self) -> SamplingParams:
        return self.settings.sampling_params()

    # -- memory and models -------------------------------------------------------------------

    def memory(self) -> MemoryFigures:
        session = self._session
        if session is None:
            return MemoryFigures()
        measured = reserved = None
        device, preloaded = "", False
        report = _runner_memory(session)
        if report is not None:
            from localinfer.budget.measured import measured_memory

            held = measured_memory(report, self._growth)
            if held.rest is not None:
                measured = MemoryParts(held.weights, held.kv_cache, held.rest)
            reserved, device, preloaded = held.reserved, held.device, held.library_preloaded
        try:
            predicted, available = _predicted_memory(session)
        except Exception:  # noqa: BLE001 - a budget bug must not hide the measured figures
            predicted, available = None, None
        return MemoryFigures(predicted, measured, available, device, reserved, preloaded)

    def model_choices(self, ctx: int | None = None) -> list[ModelChoice]:
        from localinfer.session import DEFAULT_MODEL

        current = self.settings.model or DEFAULT_MODEL
        return list_model_choices(ctx or self.settings.ctx, self.settings, current)


def _close_result(future: Future[_Opened]) -> None:
    if future.exception() is None:
        future.result().session.close()


def _runner_memory(session: SessionLike) -> Any:
    memory = getattr(session, "memory", None)
    if callable(memory):
        return memory()
    runner = getattr(getattr(session, "engine", None), "runner", None)
    return runner.memory() if runner is not None else None


def _predicted_memory(session: SessionLike) -> tuple[Any, int | None]:
    """The budget's prediction for the loaded model at its actual slots x context, backend and
    KV cache type (the session's own budget where it was asked one: not under --force), and the
    memory the budget says this machine has."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest

    report = getattr(session, "budget", None)
    if report is None:
        runner = session.engine.runner
        info, kv = runner.info, getattr(runner, "kv_type", None)  # llama.cpp's --kv-dtype
        request = BudgetRequest(
            model=str(session.model.path),
            ctx=info.max_ctx,
            concurrency=info.slots,
            backend=info.backend,
            kv_dtype=None if kv is None else kv.name,
        )
        try:
            report = compute_budget(request)
        except LocalinferError:
            return None, None
    parts = MemoryParts(report.weights_bytes, report.kv_cache_bytes, report.overhead_bytes)
    return parts, report.available_bytes
