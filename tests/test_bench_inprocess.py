"""`localinfer bench MODEL`: the same load through the engine in this process."""

from __future__ import annotations

import importlib.util
import json

import pytest

from localinfer.cli import main

pytest.importorskip("llama_cpp")

BASE = ["bench", "--backend", "llamacpp", "--threads", "1", "--sizes", "short", "--no-progress"]

# The PNG is optional (matplotlib is the `plot` extra); the figures are not.
HAS_PLOT = importlib.util.find_spec("matplotlib") is not None


def test_in_process_bench_json_and_plot(tmp_path, capsys) -> None:
    png = tmp_path / "plot.png"
    plot = ["--plot", str(png)] if HAS_PLOT else []
    args = [*BASE, "--slots", "2", "--ctx", "256", "--concurrency", "1,2", "--requests", "3",
            "--max-tokens", "4", "--ignore-eos", "--json", *plot]  # fmt: skip
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"].startswith("in-process smollm2-135m")
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["ok"] == 3 and level["errors"] == 0
        assert level["output_tokens"] == 3 * 4  # exact: counted from the engine's token ids
        assert level["token_count_from"] == ["events"]
        assert level["ttft_s"]["count"] == 3 and level["tpot_s"]["count"] == 3
        assert level["ttft_s"]["p50"] <= level["ttft_s"]["p95"] <= level["ttft_s"]["p99"]
        assert level["ttft_s"]["p99"] <= level["e2e_s"]["p99"]
    assert not HAS_PLOT or png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_in_process_table(capsys) -> None:
    args = [*BASE, "--concurrency", "2", "--requests", "2", "--max-tokens", "2", "--warmup", "0",
            "--ctx", "256"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "in-process smollm2-135m" in out and "TTFT ms" in out


def test_prompt_and_answer_must_fit_a_slot(capsys) -> None:
    args = ["bench", "--backend", "llamacpp", "--ctx", "128", "--sizes", "long", "--requests",
            "1", "--concurrency", "1", "--no-progress"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "longest prompt" in err and "raise --ctx" in err


def test_url_and_model_together_are_refused(capsys) -> None:
    assert main(["bench", "smollm2-135m", "--url", "http://127.0.0.1:1"]) == 1
    assert "either --url" in capsys.readouterr().err


def test_unreachable_url_is_one_line(capsys) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--no-progress"]) == 1
    assert "cannot reach" in capsys.readouterr().err
