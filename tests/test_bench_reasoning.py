"""scripts/bench-reasoning runs end to end (its figures are not asserted: no test depends on the
machine's speed). In this process, on a tiny model: the bench's own steps (a session, the split
off and on, the verdict) are what is tested; `scripts/bench-reasoning --help` in
tests/test_scripts.py covers the script's start from a shell."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.reasoning_cost import main
from tests.model_files import tiny_chat_gguf


def test_the_bench_prints_both_rates_and_a_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_chat_gguf(tmp_path))
    assert main(["--model", model, "--tokens", "8", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("split off" in line for line in lines)
    assert any("split on" in line and ("ok" in line or "MISSED" in line) for line in lines)
