"""Memory stays flat in a long chat (#39): a 200-turn conversation through the real chat app
(headless, ``App.run_test``) on the embedded model at ctx 2048, short greedy answers, the
conversation cut past the context as the chat does (drop-oldest, the kept turns' KV moved), saved
after every answer as the chat does. The process's RSS is read after turns 20, 50, 100, 150 and
200 (after a garbage collection); the target is RSS after turn 200 within 10% of RSS after
turn 20.
  scripts/bench-chat-memory
  scripts/bench-chat-memory --turns 100 --backend llamacpp

Every message stays on screen (the turns the model no longer sees too), so what grows is the
conversation's widgets and text, not the engine's: the figure says how much that costs.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The chat app, its host and the budget's RSS reader are imported where they are used: `--help`
# imports none of them.
if TYPE_CHECKING:
    from localinfer.tui.app import ChatApp

CHECKPOINTS = (20, 50, 100, 150, 200)
SIZE = (120, 40)


def question(i: int) -> str:
    return f"Question {i}: name one thing about the river, the old mill and hill number {i}."


async def wait_for(pilot: Any, condition: Any, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the chat did not answer in time")
        await pilot.pause(0.02)


async def send(pilot: Any, app: ChatApp, text: str) -> None:
    """Send ``text``; return once it is answered (or refused: then raise)."""
    from localinfer.tui.prompt_input import PromptInput

    before = len(app.conversation.messages), len(app.query(".notice.error"))
    app.query_one(PromptInput).load_text(text)
    await pilot.press("enter")

    def ended() -> bool:
        now = len(app.conversation.messages), len(app.query(".notice.error"))
        return not app.answering and (now[0] > before[0] + 1 or now[1] > before[1])

    await wait_for(pilot, ended)
    if app.conversation.messages[-1].role != "assistant":
        raise RuntimeError(f"turn not answered: {text!r}")


def trim_heap() -> int | None:
    """RSS after glibc's malloc_trim(0) hands the C heap's free pages back (None elsewhere):
    what is left is what the process holds live, the rest freed memory the allocator kept."""
    from localinfer.budget.measured import process_rss

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return process_rss()


def mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


async def run(args: argparse.Namespace, root: Path) -> dict[int, int | None]:
    from localinfer.budget.measured import process_rss
    from localinfer.conversations import ConversationStore
    from localinfer.tui.app import ChatApp
    from localinfer.tui.host import ChatHost, open_with_settings
    from localinfer.tui.settings import ChatSettings

    settings = ChatSettings(ctx=args.ctx, slots=1, threads=args.threads, backend=args.backend,
                            temperature=0.0, max_tokens=args.max_tokens)  # fmt: skip
    host = ChatHost(settings, opener=partial(open_with_settings, kv=None))
    app = ChatApp(host, ConversationStore(root))
    rss: dict[int, int | None] = {}
    trimmed: dict[int, int | None] = {}
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: host.loaded and not app.loading)
            start = time.perf_counter()
            for turn in range(1, args.turns + 1):
                await send(pilot, app, question(turn))
                if turn in CHECKPOINTS or turn == args.turns:
                    await app.workers.wait_for_complete()
                    gc.collect()
                    rss[turn] = process_rss()
                    trimmed[turn] = trim_heap()
                    outside, took = app.conversation.context_start, time.perf_counter() - start
                    print(f"turn {turn:4}: RSS {mib(rss[turn])} ({mib(trimmed[turn])} after "
                          f"malloc_trim), {outside} messages outside the context, {took:.0f} s",
                          flush=True)  # fmt: skip
    finally:
        host.close()
    return rss


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench-chat-memory")
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", choices=("llamacpp", "torch", "mlx"), default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rss = asyncio.run(run(args, Path(tmp)))
    first, last = rss.get(20), rss.get(args.turns)
    if first is None or last is None:
        print("RSS unreadable here (Linux /proc only), or fewer than 20 turns")
        return 1
    growth = last / first - 1
    verdict = "met" if abs(growth) <= 0.10 else "NOT met"
    print(f"RSS after turn {args.turns} vs turn 20: {mib(last)} vs {mib(first)}: "
          f"{growth:+.1%} (target within 10%: {verdict})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
