"""`localinfer generate` end to end on the embedded model: in-process through cli.main, and as a
real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localinfer.cli import main

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"


def test_generate_json_on_the_embedded_model(capsys) -> None:
    rc = main(["generate", QUESTION, "--backend", "torch", "--max-tokens", "24", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    # fp32 torch answers this one greedily (docs/facts.md, "Greedy answers differ between
    # correct backends"); the eos token ends it.
    assert doc["text"] == "The capital of France is Paris."
    assert doc["finish_reason"] == "stop"
    assert doc["model"] == "smollm2-135m" and doc["backend"] == "torch"
    usage = doc["usage"]
    assert usage["prompt_tokens"] == 37  # the ChatML prompt (docs/facts.md)
    assert usage["completion_tokens"] == len(doc["token_ids"]) == 8
    assert usage["total_tokens"] == 45
    assert doc["metrics"]["ttft_s"] > 0 and doc["metrics"]["decode_tps"] > 0


def test_generate_streams_text_and_honours_stop(capsys) -> None:
    rc = main(
        ["generate", "smollm2-135m", QUESTION, "--backend", "torch", "--stop", " Paris"]
        + ["--system", "You answer in one sentence.", "--max-tokens", "24"]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("The capital of France is") and "Paris" not in out
    assert "TTFT" in err and "tok/s" in err and "finish: stop" in err


def test_generate_errors_are_one_line(capsys) -> None:
    assert main(["generate", QUESTION, "--temperature", "-1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: --temperature") and err.count("\n") == 1
    with pytest.raises(SystemExit):  # argparse: one line of usage, exit 2
        main(["generate", "a", "b", "c"])
    assert "unrecognized arguments: c" in capsys.readouterr().err
    long_prompt = "word " * 40
    assert main(["generate", long_prompt, "--backend", "torch", "--ctx", "32"]) == 1
    err = capsys.readouterr().err
    assert "maximum context length is 32 tokens" in err and "nothing was truncated" in err
    assert main(["generate", "no-such-model-xyz", "hi"]) == 1
    assert "unknown model" in capsys.readouterr().err


def test_generate_as_a_subprocess_on_the_default_backend() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "localinfer", "generate", "1, 2, 3, 4,", "--raw", "--json"]
        + ["--max-tokens", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["usage"]["prompt_tokens"] == 11  # "1" "," " " ... : no chat template, no BOS
    assert 1 <= doc["usage"]["completion_tokens"] <= 3
    assert doc["finish_reason"] in ("stop", "length") and doc["text"].strip()
