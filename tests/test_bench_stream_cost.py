"""scripts/bench-stream-cost end to end: one server per event loop, streamed and whole answers,
and the asyncio server really runs without uvloop. On a tiny model: the servers, the loops and
the per-token figures are what is tested, not the embedded model's speed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.child import child_env, module_argv
from bench.stream_cost import server_env
from tests.model_files import tiny_chat_gguf

ROOT = Path(__file__).resolve().parents[1]


def test_the_asyncio_server_cannot_import_uvloop(tmp_path: Path) -> None:
    env = server_env("asyncio", tmp_path)
    assert env is not None and server_env("auto", tmp_path) is None
    done = subprocess.run([sys.executable, "-c", "import uvloop"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "hidden by bench/stream_cost.py" in done.stderr


def test_bench_prints_each_loop_and_mode(tmp_path: Path) -> None:
    model = str(tiny_chat_gguf(tmp_path))
    done = subprocess.run(
        module_argv("bench.stream_cost", "--model", model, "--tokens", "6", "--rounds", "1",
                    "--threads", "1", "--loops", "auto,asyncio"),
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("auto", "streamed"),
        ("auto", "whole"),
        ("asyncio", "streamed"),
        ("asyncio", "whole"),
    ]
    for row in rows:
        assert float(row[2]) > 0 and float(row[4]) > 0  # wall and main-thread CPU per token
