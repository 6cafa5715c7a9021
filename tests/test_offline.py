"""Offline: with HF_HUB_OFFLINE=1 and HF_ENDPOINT pointing at a closed port, everything on disk
works (models, budget, generate, chat, serve, bench, rm) and `pull` fails at once with a clear
line; without the offline flag, an unreachable or silent Hub also fails fast, never hangs.

A model is first pulled from the fake Hub on 127.0.0.1 into a temporary cache, so "on disk"
covers a downloaded model as well as the embedded one. Subprocess timeouts only stop a hung
test; what is asserted is the behaviour."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localinfer.loading.embedded import embedded_model_path
from tests.hub_server import FakeHub
from tests.test_pull import FILE_Q8, REPO_360, cli, hub_env

pytest.importorskip("llama_cpp")
# One thread: llama.cpp's spinning threads only wait on each other on a busy shared machine.
LLAMA = ["--backend", "llamacpp", "--threads", "1"]
# What works offline is the resolving and loading: a small context and one slot load the same
# file for less KV cache to set up.
SMALL = ["--ctx", "256", "--slots", "1"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens here once the socket is closed


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face cache holding smollm2-360m Q8_0, pulled from the fake Hub."""
    root = tmp_path_factory.mktemp("offline")
    with FakeHub() as hub:
        hub.add_file(REPO_360, FILE_Q8, embedded_model_path().read_bytes())
        env = hub_env(root, hub.url)
        done = cli(env, "pull", "smollm2-360m", "--quant", "Q8_0", "--quiet", "--device", "64GiB")
        assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def offline(cache: Path) -> dict[str, str]:
    return hub_env(cache, f"http://127.0.0.1:{closed_port()}", HF_HUB_OFFLINE="1")


def test_models_and_budget_work_offline(offline: dict[str, str]) -> None:
    done = cli(offline, "models", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["smollm2-360m"]["on_disk"] and rows["smollm2-360m"]["source"] == "hf cache"
    assert rows["smollm2-135m"]["on_disk"] and rows["smollm2-135m"]["source"] == "embedded"
    assert not rows["smollm2-1.7b"]["on_disk"]  # listed from the catalog, not downloaded

    remote = cli(offline, "budget", "smollm2-1.7b", "--json", "--device", "64GiB")
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout)["model_kind"] == "catalog_remote"
    local = cli(offline, "budget", "smollm2-360m", "--json")
    assert "GGUF header" in json.loads(local.stdout)["weights_source"]


def test_generate_works_offline(offline: dict[str, str]) -> None:
    # The pulled model: resolved from the Hugging Face cache with no network.
    done = cli(offline, "generate", "smollm2-360m", "Say hi", "--max-tokens", "3", *LLAMA, *SMALL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


@pytest.mark.slow
def test_generate_embedded_and_bench_work_offline(offline: dict[str, str]) -> None:
    done = cli(offline, "generate", "Say hi", "--max-tokens", "3", *LLAMA, *SMALL)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    bench = cli(offline, "bench", "smollm2-360m", *LLAMA, "--concurrency", "1", "--requests",
                "1", "--max-tokens", "2", "--sizes", "short", "--json", "--no-progress",
                "--ctx", "256", timeout=300)  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["levels"][0]["ok"] == 1


def test_serve_works_offline(offline: dict[str, str]) -> None:
    from tests.serve_process import running_server

    args = ["smollm2-360m", "--port", "0", *LLAMA, "--slots", "1", "--ctx", "256",
            "--log-level", "warning"]  # fmt: skip
    with running_server(args, what="serve to load offline", env=offline) as url:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1


CHAT_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from localinfer.conversations import ConversationStore
    from localinfer.session import open_session
    from localinfer.tui.app import ChatApp
    from localinfer.tui.conversation_view import AnswerTurn
    from localinfer.tui.host import ChatHost
    from localinfer.tui.prompt_input import PromptInput
    from localinfer.tui.settings import ChatSettings

    async def main():
        session = open_session("smollm2-360m", backend="llamacpp", ctx=256, slots=1, threads=1)
        settings = ChatSettings(model="smollm2-360m", ctx=256, slots=1, max_tokens=4,
                                temperature=0.0)
        app = ChatApp(ChatHost(settings, session=session), ConversationStore(sys.argv[1]))
        async with app.run_test(size=(100, 30)) as pilot:
            prompt = app.query_one(PromptInput)
            prompt.focus()
            prompt.load_text("Hello")
            await pilot.press("enter")
            for _ in range(6000):
                if not app.answering:
                    break
                await pilot.pause(0.05)
            await pilot.pause()
            print("ANSWER:", app.query(AnswerTurn).first().source.strip())
        session.close()

    asyncio.run(main())
    """
)


def test_chat_works_offline(offline: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHAT_SCRIPT, str(tmp_path / "conversations")],
        env=offline, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    answer = done.stdout.split("ANSWER:", 1)[1].strip()
    assert answer


def test_pull_fails_at_once_offline(offline: dict[str, str]) -> None:
    done = cli(offline, "pull", "smollm2-1.7b", "--device", "64GiB", timeout=30)
    assert done.returncode == 1
    assert "HF_HUB_OFFLINE" in done.stderr and "models already on disk still work" in done.stderr
    assert done.stderr.count("\n") == 2  # the budget line and the one error line
    assert "Traceback" not in done.stderr
    cached = cli(
        offline, "pull", "smollm2-360m", "--quant", "Q8_0", "--device", "64GiB", timeout=30
    )
    assert cached.returncode == 0 and "already in the cache" in cached.stderr
    assert Path(cached.stdout.strip()).name == FILE_Q8


def test_unreachable_hub_fails_fast(cache: Path, tmp_path: Path) -> None:
    env = hub_env(tmp_path, f"http://127.0.0.1:{closed_port()}")
    done = cli(env, "pull", "smollm2-1.7b", "--device", "64GiB", timeout=30)
    assert done.returncode == 1
    assert "cannot reach the Hugging Face Hub at http://127.0.0.1:" in done.stderr


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers: a network that
    swallows packets, the case that hangs a client without timeouts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_silent_hub_times_out_instead_of_hanging(silent_endpoint: str, tmp_path: Path) -> None:
    # The Hub timeout (5 s for a user) shortened: the endpoint never answers, so any timeout
    # ends in the same failure; what is checked is that it comes, and how it is said.
    env = hub_env(tmp_path, silent_endpoint, LOCALINFER_HUB_TIMEOUT_S="0.5")
    done = cli(env, "pull", "smollm2-1.7b", "--device", "64GiB", timeout=30)
    assert done.returncode == 1
    assert "cannot reach the Hugging Face Hub" in done.stderr


def test_rm_works_offline(cache: Path, offline: dict[str, str]) -> None:
    done = cli(offline, "rm", "smollm2-360m")
    assert done.returncode == 0, done.stderr
    assert "freed" in done.stdout
    assert not list((cache / "hf-cache").glob("models--*"))
