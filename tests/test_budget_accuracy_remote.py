"""scripts/budget-accuracy's "remote = local" check (issue 22): run end to end against the fake
Hub on 127.0.0.1, and its verdict on budgets that differ."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import budget_accuracy


def test_remote_equals_local_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The script's main with its command line, in this process: its two sides still run as
    # processes of their own pointed at the fake Hub, as the script runs them; a third process
    # around them would only start another interpreter.
    monkeypatch.chdir(tmp_path)
    code = budget_accuracy.main(["--remote-only", "--ctx", "1024", "--concurrency", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASS: 3/3 remote budgets equal to local" in out
    rows = [line for line in out.splitlines() if line.startswith("local/SmolLM2")]
    assert len(rows) == 3 and all(row.endswith("| equal") for row in rows)
    # Before the pull, the GGUF's header only (2 MiB of 94 MiB) and the safetensors header.
    assert "SmolLM2-135M-Instruct.Q4_1.gguf 2,097,152 of " in out
    assert "model.safetensors 100,001 of " in out


def figures(weights: int, kv: int, kind: str) -> dict[str, object]:
    return {"weights": weights, "kv": kv, "kind": kind, "source": "test"}


@pytest.mark.parametrize(
    ("pulled", "file", "words"),
    [
        (figures(100, 20, "gguf"), figures(100, 20, "gguf"), "| equal"),
        (figures(100, 24, "gguf"), figures(100, 20, "gguf"), "kv pulled +4"),
        (figures(100, 20, "gguf"), figures(90, 20, "gguf"), "weights file -10"),
        (figures(100, 20, "hub_remote"), figures(100, 20, "gguf"), "not a before/after pair"),
    ],
)
def test_the_verdict_names_each_difference(
    capsys: pytest.CaptureFixture[str], pulled: dict, file: dict, words: str
) -> None:
    remote = {"org/repo:Q4_1 llamacpp": {"remote": figures(100, 20, "hub_remote")}}
    local = {"org/repo:Q4_1 llamacpp": {"pulled": pulled, "file": file}}
    same = words == "| equal"
    assert budget_accuracy.print_remote_table(remote, local) is same
    out = capsys.readouterr().out
    assert words in out
    assert ("PASS: 1/1" if same else "FAIL: 0/1") in out
