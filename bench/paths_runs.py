"""One answer through each way of running a model, timed the same way: scripts/bench-paths.

Every path reports the engine's own decode rate of the request (RequestMetrics.decode_tps: tokens
after the first over the time since the first), and the CPU each group of the process's threads
spent per token from the first token to the end (bench/thread_cpu.py). The paths:

- ``serve``: `localinfer serve --slots 1` in its own process, one streaming chat client;
- ``generate``: `localinfer generate` in its own process, streaming to a pipe;
- ``chat``: the real chat app, headless, in this process (bench/chat.py);
- ``api``: ``open_session`` and ``engine.submit`` in this process, as a Python program would.

serve, generate and api run to max_tokens (ignore_eos); the chat stops where the model ends its
answer, as a user's chat does (its rate is per token all the same).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.thread_cpu import ThreadShare, ThreadTime, shares, snapshot

# The server, HTTP client and chat app are imported where they are used: `scripts/bench-paths
# --help` (bench/paths.py) loads this module and imports none of them.
if TYPE_CHECKING:
    from bench.chat import ChatBenchConfig
    from bench.peer_servers import Server

PROMPT = "Write a long story about a robot who learns to paint."
PATHS = ("serve", "generate", "chat", "api")


@dataclass(frozen=True, slots=True)
class Sampling:
    name: str
    temperature: float
    top_p: float


# Greedy; the chat's temperature alone; the chat's defaults (temperature 0.7, top_p 0.95).
SAMPLINGS = (
    Sampling("greedy", 0.0, 1.0),
    Sampling("t=0.7", 0.7, 1.0),
    Sampling("t=0.7 top_p=0.95", 0.7, 0.95),
)


@dataclass(frozen=True, slots=True)
class PathSetup:
    """What every path runs: the same model, context, backend, threads, prompt and length."""

    model: str
    tokens: int = 256
    ctx: int = 2048
    backend: str | None = None
    threads: int | None = None
    prompt: str = PROMPT
    seed: int = 0

    def model_options(self) -> list[str]:
        argv = ["--ctx", str(self.ctx)]
        if self.backend:
            argv += ["--backend", self.backend]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        return argv

    def sampling_options(self, sampling: Sampling) -> list[str]:
        return ["--max-tokens", str(self.tokens), "--temperature", str(sampling.temperature),
                "--top-p", str(sampling.top_p), "--seed", str(self.seed)]  # fmt: skip


@dataclass(frozen=True, slots=True)
class PathRun:
    path: str
    sampling: str
    tps: float | None  # the engine's decode rate of the request
    tokens: int  # completion tokens
    cpu: list[ThreadShare]  # per token, first token -> end


def _cpu(pid: int, first: dict[int, ThreadTime] | None, last: dict, tokens: int) -> list:
    return [] if first is None else shares(pid, first, last, max(tokens - 1, 1))


def start_serve(setup: PathSetup) -> Server:
    """`localinfer serve MODEL --slots 1` with the setup's context, backend and threads."""
    from bench.peer_servers import start
    from localinfer.server.host import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "localinfer", "serve", setup.model, "--port", str(port),
           "--slots", "1", "--log-level", "warning", "--served-name", "bench",
           *setup.model_options()]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return start("localinfer serve", cmd, url, "/health", extra_body={}, model="bench")


def run_serve(server: Server, setup: PathSetup, sampling: Sampling) -> PathRun:
    """One streaming chat completion; the rate from the last chunk's ``timings``."""
    import httpx

    body = {"model": server.model, "messages": [{"role": "user", "content": setup.prompt}],
            "max_tokens": setup.tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "seed": setup.seed, "stream": True,
            "ignore_eos": True}  # fmt: skip
    pid = server.proc.pid
    first: dict[int, ThreadTime] | None = None
    timings: dict[str, Any] = {}
    url = server.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=900) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            timings = chunk.get("timings") or timings
            choices = chunk.get("choices") or [{}]
            if first is None and choices[0].get("delta", {}).get("content"):
                first = snapshot(pid)
    last = snapshot(pid)
    tokens = int(timings.get("completion_tokens") or 0)
    tps = timings.get("decode_tokens_per_second")
    return PathRun("serve", sampling.name, tps, tokens, _cpu(pid, first, last, tokens))


# generate's metrics line on stderr: "... · 123.4 tok/s · 40 prompt + 256 completion tokens · ..."
_METRICS = re.compile(r"([\d.]+) tok/s · (\d+) prompt \+ (\d+) completion tokens")


def run_generate(setup: PathSetup, sampling: Sampling) -> PathRun:
    """`localinfer generate` streaming to a pipe; its threads read at the answer's first byte and
    when its metrics line (printed before the session closes) arrives."""
    cmd = [sys.executable, "-m", "localinfer", "generate", setup.model, setup.prompt,
           "--ignore-eos", *setup.sampling_options(sampling), *setup.model_options()]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marks: dict[str, dict[int, ThreadTime]] = {}

    def first_byte() -> None:
        assert proc.stdout is not None
        if proc.stdout.read(1):
            marks["first"] = snapshot(proc.pid)
        proc.stdout.read()  # drain, so generate never blocks on a full pipe

    reader = threading.Thread(target=first_byte, daemon=True)
    reader.start()
    assert proc.stderr is not None
    found, tail = None, []
    for raw in proc.stderr:
        line = raw.decode(errors="replace")
        tail.append(line)
        found = found or _METRICS.search(line)
        if found and "last" not in marks:
            marks["last"] = snapshot(proc.pid)
    proc.wait(timeout=900)
    reader.join(timeout=60)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"localinfer generate failed: {''.join(tail)[-2000:]}")
    tokens = int(found.group(3))
    cpu = _cpu(proc.pid, marks.get("first"), marks["last"], tokens)
    return PathRun("generate", sampling.name, float(found.group(1)), tokens, cpu)


def run_api(session: Any, setup: PathSetup, sampling: Sampling) -> PathRun:
    """``engine.submit`` on an open session, as a Python program would."""
    from localinfer.engine import Request, SamplingParams

    ids = session.chat_prompt_ids([{"role": "user", "content": setup.prompt}])
    params = SamplingParams(max_tokens=setup.tokens, temperature=sampling.temperature,
                            top_p=sampling.top_p, seed=setup.seed, ignore_eos=True)  # fmt: skip
    handle = session.engine.submit(Request(ids, params))
    first: dict[int, ThreadTime] | None = None
    for event in handle:
        if first is None and event.token_ids:
            first = snapshot(os.getpid())
    last = snapshot(os.getpid())
    result = handle.result()
    m = result.metrics
    tokens = len(result.token_ids)
    cpu = _cpu(os.getpid(), first, last, tokens)
    return PathRun("api", sampling.name, m.decode_tps if m else None, tokens, cpu)


def chat_config(setup: PathSetup, sampling: Sampling) -> ChatBenchConfig:
    from bench.chat import ChatBenchConfig

    return ChatBenchConfig(
        prompt=setup.prompt,
        model=setup.model,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=setup.tokens,
        window=max(setup.tokens // 4, 1),
        backend=setup.backend,
        threads=setup.threads,
        ctx=setup.ctx,
        keys=0,  # no typing: the chat's own cost, as a reader waiting for the answer
    )


def run_chat_path(session: Any, setup: PathSetup, sampling: Sampling) -> PathRun:
    """The real chat app, headless, on an open session."""
    import asyncio

    from bench.chat import run_chat
    from localinfer.conversations import ConversationStore

    with tempfile.TemporaryDirectory() as tmp:
        chat = asyncio.run(run_chat(session, chat_config(setup, sampling), ConversationStore(tmp)))
    return PathRun("chat", sampling.name, chat.decode_tps, chat.completion_tokens, chat.cpu)
