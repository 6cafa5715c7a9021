"""scripts/bench-chat's parts: the headless chat run and its measurements, the `localinfer
generate` reference on the same request, and the verdict against the issue's targets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench.chat import (
    BenchHost,
    ChatBenchConfig,
    ChatRun,
    EngineRun,
    run_chat,
    run_engine_alone,
)
from bench.chat_report import GenerateRun, report_lines, run_generate, verdicts
from bench.child import child_env, module_argv
from localinfer.conversations import ConversationStore
from tests.model_files import tiny_chat_gguf
from tests.tui_pilot import ScriptedChatSession, module_session

session = module_session(512)
SCRIPT = "A short story, told slowly. " * 40


class Paced:
    """Events of ``handle`` no faster than one per ``gap`` seconds, as a slow engine gives them."""

    def __init__(self, handle: Any, gap: float) -> None:
        self._handle, self._gap = handle, gap

    def __iter__(self):
        for event in self._handle:
            time.sleep(self._gap)
            yield event


def test_chat_run_measures_the_answer_and_the_keys_typed_meanwhile(tmp_path, monkeypatch):
    scripted = ScriptedChatSession(SCRIPT)
    submit = BenchHost.submit
    monkeypatch.setattr(BenchHost, "submit", lambda self, r: Paced(submit(self, r), 0.005))
    config = ChatBenchConfig(max_tokens=1000, window=40, keys=3, key_interval_s=0.05)
    try:
        run = asyncio.run(run_chat(scripted, config, ConversationStore(tmp_path)))
    finally:
        scripted.close()
    assert run.text == SCRIPT and run.finish_reason == "stop"
    tokens = len(scripted.tokens)
    assert run.completion_tokens == tokens + 1  # the script, then the end token
    assert len(run.arrivals) >= tokens and run.arrivals == sorted(run.arrivals)
    assert run.window_rate(True, 40) > 0 and run.window_rate(False, 40) > 0
    assert run.window_rate(True, len(run.arrivals)) is None  # not enough tokens for the window
    assert run.decode_tps and run.decode_tps > 0  # the engine's own timing
    assert 0 < run.ui_cpu_s <= run.process_cpu_s
    assert len(run.key_latencies_s) == 3 and all(t > 0 for t in run.key_latencies_s)
    assert 1 <= run.renders < tokens / 2 and run.stats_renders >= 1


def test_generate_and_the_engine_alone_answer_the_chats_request(session, tmp_path):
    config = ChatBenchConfig(max_tokens=8, keys=0)
    chat = asyncio.run(run_chat(session, config, ConversationStore(tmp_path)))
    generate = run_generate(config)
    alone = run_engine_alone(session, config)
    assert generate.completion_tokens == chat.completion_tokens == len(alone.arrivals) == 8
    # The same request: prompt, template, greedy, budget.
    assert generate.text == chat.text == alone.text
    assert generate.decode_tps and generate.decode_tps > 0
    assert alone.decode_tps and alone.decode_tps > 0


def test_verdicts_against_the_targets():
    run = ChatRun(
        text="x",
        finish_reason="length",
        decode_tps=57.0,
        completion_tokens=1000,
        ui_cpu_s=1.5,
        arrivals=[i / 60 for i in range(1000)],
        key_latencies_s=[0.004, 0.02],
    )
    generate = GenerateRun("x", 60.0, 1000, "torch")
    # The engine alone slowed to 0.8x over the answer: the chat's 1.0x is not slower than that.
    alone = EngineRun("x", 60.0, [i / 60 if i < 500 else (i - 100) / 48 for i in range(1000)])
    config = ChatBenchConfig()
    got = {v.name: v for v in verdicts(config, run, generate, alone)}
    assert got["chat / generate decode"].ok and "0.95x" in got["chat / generate decode"].figure
    slowdown = got["last 200 / first 200"]
    assert slowdown.ok and "1.00x; engine alone 0.80x" in slowdown.figure
    assert got["UI thread CPU per 100 tokens"].ok  # 0.15 s
    assert got["keys while streaming"].ok is False  # 20 ms is more than a frame
    slow = ChatRun(decode_tps=30.0, completion_tokens=1000, ui_cpu_s=6.5, arrivals=[0.0])
    missed = {v.name: v.ok for v in verdicts(config, slow, generate, alone)}
    assert missed["chat / generate decode"] is False
    assert missed["UI thread CPU per 100 tokens"] is False
    assert missed["last 200 / first 200"] is None and missed["keys while streaming"] is None
    arrivals = [i / 60 + (i / 400) ** 2 for i in range(1000)]
    slowing = ChatRun(completion_tokens=1000, arrivals=arrivals)
    steady = EngineRun("x", 60.0, [i / 60 for i in range(1000)])
    judged = {v.name: v.ok for v in verdicts(config, slowing, generate, steady)}
    assert judged["last 200 / first 200"] is False  # the chat slows where the engine did not
    lines = report_lines(config, run, generate, alone, "header")
    assert lines[0] == "header" and any("MISSED" in line for line in lines)
    assert "same answer: yes" in lines[-1]


def test_bench_chat_quick_run(tmp_path: Path) -> None:
    """scripts/bench-chat --quick end to end: the table, then one JSON line with every figure.
    On a tiny model: the script's plumbing is tested here (the embedded model's answer through
    the same three paths is the test above), and 3 x 200 tokens of it cost next to nothing."""
    model = str(tiny_chat_gguf(tmp_path))
    argv = module_argv("bench.chat_cli", "--quick", "--threads", "1", "--model", model)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=child_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["tokens"] == 200 and got["same_answer"] and got["threads"] == 1
    rates = ("chat_tps", "generate_tps", "first_tps", "last_tps", "engine_alone_tps")
    for key in (*rates, "ui_cpu_per_100", "engine_alone_last_vs_first"):
        assert got[key] > 0, key
    assert got["chat_vs_generate"] == pytest.approx(got["chat_tps"] / got["generate_tps"])
    assert set(got["met"]) == {
        "chat / generate decode",
        "last 50 / first 50",
        "UI thread CPU per 100 tokens",
        "keys while streaming",
    }
    assert "chat / generate decode" in out and "same answer: yes" in out
