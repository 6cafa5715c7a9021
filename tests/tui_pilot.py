"""What the headless chat app tests share: a module's session on the embedded model, and polling
the app through its pilot."""

from __future__ import annotations

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
