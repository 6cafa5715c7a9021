"""A GGUF whose chat template would loop for ever: refused with one line by the real
``localinfer generate`` process (at load time), and, when only some conversations set it off, a
400 from the real HTTP server that goes on serving (issue #18, item 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from model_files import CHATML, TINY_VOCAB_SIZE, write_gguf
from tiny import tiny_config, tiny_weights

from localinfer.server import ServerThread, create_app
from localinfer.session import Session, open_session

NESTED_RANGES = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + CHATML
)
# Harmless on one message (so it loads), 10^10 iterations once a conversation has two.
RUNAWAY_ON_TWO = (
    "{% if messages | length > 1 %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif %}" + CHATML
)


pytestmark = pytest.mark.usefixtures("session_cache")


def _tiny_gguf(path: Path, template: str) -> Path:
    config = tiny_config("llama", vocab_size=TINY_VOCAB_SIZE)
    ws = tiny_weights(config)
    return write_gguf(path, config, {n: ws.get(n) for n in ws.names()}, chat_template=template)


def test_generate_refuses_a_runaway_template_with_one_line(tmp_path: Path) -> None:
    path = _tiny_gguf(tmp_path / "runaway.gguf", NESTED_RANGES)
    argv = [sys.executable, "-m", "localinfer", "generate", str(path), "Hi", "--max-tokens", "2"]
    env = {**os.environ, "LOCALINFER_CACHE_DIR": str(tmp_path / "cache")}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("generate hung in the chat template")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localinfer: error: "), done.stderr
    assert "runaway.gguf" in lines[0] and "chat template refused" in lines[0]
    assert "loop iterations" in lines[0]


@pytest.fixture(scope="module")
def runaway_session(tmp_path_factory) -> Iterator[Session]:
    path = _tiny_gguf(tmp_path_factory.mktemp("limits") / "on-two.gguf", RUNAWAY_ON_TWO)
    session = open_session(str(path), slots=1, ctx=128, threads=1)
    yield session
    session.close()


def test_server_answers_400_and_keeps_serving(runaway_session: Session) -> None:
    two = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with ServerThread(create_app(runaway_session)) as server:  # type: ignore[arg-type]
        url = server.url + "/v1/chat/completions"
        bad = httpx.post(url, json={"messages": two, "max_tokens": 2}, timeout=300)
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert "chat template refused" in error["message"], error
        assert "loop iterations" in error["message"], error
        one = [{"role": "user", "content": "Hi"}]
        ok = httpx.post(url, json={"messages": one, "max_tokens": 2}, timeout=300)
        assert ok.status_code == 200, ok.text
        assert json.loads(ok.text)["choices"][0]["finish_reason"] in ("length", "stop")
