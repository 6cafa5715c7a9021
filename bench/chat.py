"""scripts/bench-chat: the chat app driven headless on a real model, timed where it matters.

One streamed answer through the real :class:`ChatApp` (``App.run_test``): a fixed prompt, greedy,
a fixed token budget. Recorded: the engine's own timing of the request (decode tok/s), when each
token reached the app's stream worker (the rate over the first and the last tokens), the UI
thread's CPU time from send to the answer on screen (``time.thread_time`` in that thread), how
many times the answer was rendered, and how long keys typed while it streams take to reach the
prompt. bench/chat_report.py adds `localinfer generate`'s rate and prints the verdict.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from textual import events

from bench.thread_cpu import ThreadShare, ThreadTime, shares, snapshot
from localinfer.tui.app import ChatApp
from localinfer.tui.conversation_view import AnswerTurn
from localinfer.tui.host import ChatHost
from localinfer.tui.prompt_input import PromptInput
from localinfer.tui.settings import ChatSettings
from localinfer.tui.stream_pump import AnswerEnd

PROMPT = "Write a long story about a robot who learns to paint."
KEYS = "thequickbrownfoxjumps"  # typed one by one while the answer streams


@dataclass(slots=True, frozen=True)
class ChatBenchConfig:
    prompt: str = PROMPT
    model: str | None = None  # None: the embedded model, as `localinfer chat`
    temperature: float = 0.0  # greedy: every path gives the same answer
    top_p: float = 1.0
    max_tokens: int = 1000
    window: int = 200  # tokens in the first and in the last rate window
    backend: str | None = None  # None: this machine's default, as `localinfer chat`
    threads: int | None = None  # None: the backend's default, as `localinfer chat`
    ctx: int = 2048
    keys: int = 20  # keys typed while streaming
    key_interval_s: float = 0.25  # between two typed keys
    size: tuple[int, int] = (120, 40)  # terminal columns x rows
    earlier: int = 0  # finished answers on screen above the measured one (earlier_answer())

    def settings(self) -> ChatSettings:
        return ChatSettings(
            model=self.model,
            backend=self.backend,
            threads=self.threads,
            ctx=self.ctx,
            slots=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
        )


@dataclass(slots=True)
class ChatRun:
    """What one streamed answer in the app measured."""

    text: str = ""
    finish_reason: str | None = None
    decode_tps: float | None = None  # the engine's own timing of the request
    completion_tokens: int = 0
    ui_cpu_s: float = 0.0  # the UI thread, send -> the whole answer rendered
    process_cpu_s: float = 0.0  # every thread of the process over the same span
    wall_s: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # perf_counter per token, at the pump
    key_latencies_s: list[float] = field(default_factory=list)
    renders: int = 0  # times the answer's Markdown was updated
    cpu: list[ThreadShare] = field(default_factory=list)  # first token -> end, per token
    stats_renders: int = 0  # times the side panel's figures were updated

    def window_rate(self, first: bool, window: int) -> float | None:
        """Tokens/s over the first (or last) ``window`` token intervals that reached the app."""
        return window_rate(self.arrivals, first, window)


def earlier_answer(index: int, paragraphs: int = 6) -> str:
    """A finished answer of about 1,000 tokens of the embedded model's tokenizer (~4,600
    characters) as the chat shows it: paragraphs, a list and a fenced code block. Deterministic,
    so runs with earlier answers on screen lay out the same text."""
    sentence = (
        "The robot number {i} mixed a careful blue with the grey of the workshop floor, "
        "and watched the colour dry as the light moved across the window. "
    )
    parts = [f"## Part {index + 1}"]
    for p in range(paragraphs):
        parts.append("".join(sentence.format(i=index * 100 + p * 5 + k) for k in range(5)))
        if p == paragraphs // 2:
            parts.append("\n".join(f"- step {k}: choose a brush, wet it, paint" for k in range(6)))
            parts.append("```python\nfor stroke in range(10):\n    canvas.paint(stroke)\n```")
    return "\n\n".join(parts)


def window_rate(arrivals: list[float], first: bool, window: int) -> float | None:
    """Tokens/s over the first (or last) ``window`` intervals between token arrivals."""
    if len(arrivals) <= window:
        return None
    start, end = (arrivals[0], arrivals[window]) if first else (arrivals[-window - 1], arrivals[-1])
    return window / (end - start) if end > start else None


@dataclass(slots=True)
class EngineRun:
    """The same request on the same session with no app: what the engine does by itself."""

    text: str
    decode_tps: float | None
    arrivals: list[float]


def run_engine_alone(session: Any, config: ChatBenchConfig) -> EngineRun:
    """Submit the chat's request to ``session``'s engine and stamp each token as it arrives.

    The reference for the chat's slowdown over the answer: a model decodes slower as its context
    grows (attention reads every cached token), with or without a UI.
    """
    from localinfer.engine.types import Request

    ids = session.chat_prompt_ids([{"role": "user", "content": config.prompt}])
    handle = session.engine.submit(Request(ids, config.settings().sampling_params()))
    arrivals: list[float] = []
    for event in handle:
        now = time.perf_counter()
        arrivals.extend([now] * len(event.token_ids))
    result = handle.result()
    tps = result.metrics.decode_tps if result.metrics is not None else None
    return EngineRun(result.text, tps, arrivals)


class _TimedEvents:
    """The engine's stream, stamping each token as the app's worker takes it, and the process's
    threads' CPU at the first token and at the end (bench/thread_cpu.py)."""

    def __init__(self, handle: Any, host: BenchHost) -> None:
        self._handle, self._host = handle, host

    def __iter__(self) -> Iterator[Any]:
        host = self._host
        for event in self._handle:
            now = time.perf_counter()
            if event.token_ids and host.cpu_first is None:
                host.cpu_first = snapshot(os.getpid())
            if event.finish_reason is not None:
                host.cpu_last = snapshot(os.getpid())
            host.arrivals.extend([now] * len(event.token_ids))
            yield event


class BenchHost(ChatHost):
    """The chat's host, recording token arrivals of the requests it submits."""

    def __init__(self, settings: ChatSettings, session: Any) -> None:
        super().__init__(settings, session=session)
        self.arrivals: list[float] = []
        self.cpu_first: dict[int, ThreadTime] | None = None
        self.cpu_last: dict[int, ThreadTime] | None = None

    def submit(self, request: Any) -> Any:
        return _TimedEvents(super().submit(request), self)


class BenchApp(ChatApp):
    """The real app; tells the bench when the answer finished and when a typed key arrived."""

    def __init__(self, host: ChatHost, store: Any) -> None:
        super().__init__(host, store)
        self.finished = asyncio.Event()
        self.final: Any = None
        self.typed_at: dict[int, float] = {}  # prompt length -> perf_counter when it was reached

    # Hooks the answer's end handler calls, not a second handler of AnswerFinished: Textual runs
    # every class's handler of a message, so an override calling super() would run it twice.
    def _keep_answer(self, progress: AnswerEnd) -> None:
        self.final = progress
        super()._keep_answer(progress)

    def _finish_answer(self) -> None:
        super()._finish_answer()
        self.finished.set()

    def on_text_area_changed(self, event: PromptInput.Changed) -> None:
        self.typed_at.setdefault(len(event.text_area.text), time.perf_counter())


async def _type_while_streaming(app: BenchApp, run: ChatRun, keys: int, interval: float) -> None:
    """Post key events to the prompt one by one and time each until the prompt holds it."""
    prompt = app.query_one(PromptInput)
    for i in range(keys):
        await asyncio.sleep(interval)
        if app.finished.is_set():
            return
        key = KEYS[i % len(KEYS)]
        want = len(prompt.text) + 1
        sent = time.perf_counter()
        app.post_message(events.Key(key, key))
        while want not in app.typed_at and not app.finished.is_set():
            await asyncio.sleep(0.002)
        if want in app.typed_at:
            run.key_latencies_s.append(app.typed_at[want] - sent)


async def run_chat(session: Any, config: ChatBenchConfig, store: Any) -> ChatRun:
    """Send ``config.prompt`` through the app on ``session`` and measure the answer."""
    host = BenchHost(config.settings(), session)
    app = BenchApp(host, store)
    run = ChatRun()
    async with app.run_test(size=config.size) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()  # the memory reading after mount
        for i in range(config.earlier):  # on screen only: the request stays the same
            app.view.add_user(config.prompt)
            app.view.start_answer(earlier_answer(i))
        await pilot.pause()
        prompt = app.query_one(PromptInput)
        prompt.load_text(config.prompt)
        prompt.focus()
        await pilot.pause()
        ui0, cpu0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
        app.post_message(events.Key("enter", None))
        typing = asyncio.create_task(
            _type_while_streaming(app, run, config.keys, config.key_interval_s)
        )
        await app.finished.wait()
        await typing
        await app.workers.wait_for_complete()
        await asyncio.sleep(0.1)  # the last append and repaint run on the UI thread
        run.ui_cpu_s = time.thread_time() - ui0
        run.process_cpu_s = time.process_time() - cpu0
        run.wall_s = time.perf_counter() - wall0
        answer = app.view.last_answer()
        final = app.final
        if final is None:
            raise RuntimeError("the chat kept no answer (see the app's notice)")
        run.text = final.text
        run.finish_reason = final.finish_reason
        run.decode_tps = final.stats.average_tps
        run.completion_tokens = final.stats.completion_tokens
        run.renders = answer.renders if isinstance(answer, AnswerTurn) else 0
        run.stats_renders = app.stats.renders
        run.arrivals = host.arrivals
        if host.cpu_first is not None and host.cpu_last is not None:
            steps = max(run.completion_tokens - 1, 1)
            run.cpu = shares(os.getpid(), host.cpu_first, host.cpu_last, steps)
        if answer is None or answer.source != final.text:
            raise RuntimeError("the answer on screen is not the answer the engine gave")
    return run
