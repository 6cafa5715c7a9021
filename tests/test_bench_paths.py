"""scripts/bench-paths' parts: per-thread CPU from /proc, `generate --ignore-eos`, the medians
and the verdicts, and one short run of every path on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.paths import TARGETS, medians, report
from bench.paths_runs import SAMPLINGS, PathRun
from bench.thread_cpu import ThreadTime, shares, snapshot, summary
from localinfer.cli import main
from tests.model_files import tiny_chat_gguf

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="/proc")


@linux_only
def test_a_busy_thread_shows_its_cpu() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin)
    before = snapshot(os.getpid())
    worker.start()
    stop.wait(0.3)
    after = snapshot(os.getpid())
    stop.set()
    worker.join()
    assert after[worker.native_id].seconds > 0.01
    parts = {p.group: p for p in shares(os.getpid(), before, after, tokens=10)}
    assert parts["other"].ms_per_token > 1.0  # the spinning thread, over 10 "tokens"


def test_groups_are_engine_main_and_other() -> None:
    pid = 100
    before = {100: ThreadTime(100, "python", 1.0), 101: ThreadTime(101, "li-engine", 2.0)}
    after = {
        100: ThreadTime(100, "python", 1.5),
        101: ThreadTime(101, "li-engine", 4.0),
        102: ThreadTime(102, "li-engine", 1.0),  # a worker started in between: from zero
        103: ThreadTime(103, "python", 0.0),  # idle: left out
    }
    parts = shares(pid, before, after, tokens=100)
    assert summary(parts) == "engine 30.0 (2) · main 5.0"


def test_generate_ignore_eos_runs_to_max_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    # The embedded model ends its answer to "Say hi." by itself in 24 (torch) to 30 (llama.cpp)
    # tokens: 48 leaves room for either, and --ignore-eos must then run to exactly 48. The engine
    # applies ignore_eos whatever the backend: llama.cpp answers for about half the torch
    # runner's CPU (the default here).
    pytest.importorskip("llama_cpp")
    argv = ["generate", "Say hi.", "--backend", "llamacpp", "--threads", "1", "--ctx", "512",
            "--max-tokens", "48", "--json"]  # fmt: skip
    assert main(argv) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 48
    assert main([*argv, "--ignore-eos"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["finish_reason"] == "length" and full["usage"]["completion_tokens"] == 48


def test_medians_ratios_and_targets() -> None:
    runs = [PathRun("serve", "greedy", tps, 10, []) for tps in (100.0, 120.0, 110.0)] + [
        PathRun("generate", "greedy", tps, 10, []) for tps in (50.0, 200.0, 90.0)
    ]
    median = medians(runs)
    assert median[("serve", "greedy")].tps == 110.0 and median[("generate", "greedy")].tps == 90.0
    lines = "\n".join(report("m.gguf", median, ["serve", "generate"]))
    assert "generate     90.0  0.82x" in lines
    assert "target generate greedy / serve greedy: 0.82x (>= 0.95) MISSED" in lines
    assert {t[1] for t in TARGETS} <= {s.name for s in SAMPLINGS}


def test_every_path_answers(tmp_path: Path) -> None:
    """A short run of the real script: serve, generate, the headless chat and the API. The
    paths' plumbing is what is tested, not the embedded model: a tiny model keeps the three
    `generate` processes and the server's start-up cheap."""
    model = tiny_chat_gguf(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "bench.paths", "--model", str(model), "--tokens", "4",
         "--repeats", "1", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    rates = record[0]["runs"]
    assert len(rates) == 4 * len(SAMPLINGS) and all(r and r > 0 for r in rates.values())
    assert "target chat greedy / serve greedy" in proc.stdout
