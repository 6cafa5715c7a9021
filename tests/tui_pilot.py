"""What the headless chat app tests share: a module's session on the embedded model, and polling
the app through its pilot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

SIZE = (120, 40)


def module_session(ctx: int) -> Any:
    """A module-scoped ``session`` fixture: the embedded model on the machine's default backend,
    one slot of ``ctx`` tokens, shared by the module's tests."""

    @pytest.fixture(scope="module")
    def session() -> Iterator[Any]:
        from localinfer.session import open_session

        s = open_session(ctx=ctx, slots=1)
        yield s
        s.close()

    return session


async def wait_until(pilot: Any, condition: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await pilot.pause(0.05)


class StepClock:
    """A clock that moves ``step`` seconds each time it is read: the app's notion of time made
    a function of how often it looks (throttling becomes deterministic, no wall clock)."""

    def __init__(self, step: float = 0.001) -> None:
        self.step, self.now, self.reads = step, 1000.0, 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.step
        return self.now


class ScriptedChatSession:
    """What the chat needs from a session: the embedded model's tokenizer and chat template over
    a ScriptRunner, so the real engine streams exactly ``script`` (then stops) to any prompt."""

    runner_notice = "backend: scripted"

    def __init__(self, script: str) -> None:
        from localinfer.engine import Engine
        from localinfer.loading.embedded import embedded_model_path
        from localinfer.loading.loader import load_model
        from localinfer.session import Session
        from tests.test_engine_model import ScriptRunner

        self.chat_prompt_ids = Session.chat_prompt_ids.__get__(self)
        self.render_chat = Session.render_chat.__get__(self)
        self.base_model = False
        self.model = load_model(embedded_model_path())
        tok = self.model.tokenizer
        self.tokens = tok.encode(script, add_special_tokens=False)
        eos = next(iter(tok.eos_ids))
        self.runner = ScriptRunner(
            self.tokens, end=eos, vocab_size=tok.vocab_size, slots=1, max_ctx=4096
        )
        self.engine = Engine(self.runner, tok, prefill_chunk=4096)

    def close(self) -> None:
        self.engine.close()


class ForwardGate:
    """Stands in for the runner's forward and lets a forward through only when the test says
    so: an answer is still streaming at every step the test takes, however fast this machine
    decodes (a wall-clock race otherwise)."""

    def __init__(self, forward: Callable[..., object]) -> None:
        self._forward = forward
        self._allowed = threading.Semaphore(0)
        self._open = threading.Event()

    def __call__(self, batch):
        while not self._open.is_set() and not self._allowed.acquire(timeout=0.05):
            pass
        return self._forward(batch)

    def allow_one(self) -> None:
        self._allowed.release()

    def open(self) -> None:
        self._open.set()
