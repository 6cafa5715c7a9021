"""bench/kquant_gpu.py (scripts/gpu-check's 8B Q4_K_M pass): its verdicts from given rows, and
the whole script on a scaled random file on this CPU (its logic; no speed is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.kquant_gpu import Row, verdicts
from bench.random_gguf import SHAPES, write_random_gguf

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


def rows(one: float, eight: float, memory: int | None) -> list[Row]:
    return [
        Row("m.gguf", "llamacpp", "cuda", 1, one, 100.0, memory, 5 * GiB),
        Row("m.gguf", "llamacpp", "cuda", 8, eight, 100.0, memory, 5 * GiB),
    ]


def test_verdicts_pass_and_fail_on_given_figures() -> None:
    good = verdicts(rows(70.0, 400.0, int(5.2 * GiB)), 0.5, 0.15)
    assert [ok for ok, _ in good] == [True, True, True]
    assert "0.70x the bandwidth bound" in good[0][1] and "+4.0% of the budget" in good[2][1]
    bad = verdicts(rows(40.0, 100.0, 7 * GiB), 0.5, 0.15)
    assert [ok for ok, _ in bad] == [False, False, False]
    assert len(verdicts(rows(70.0, 400.0, None), 0.5, 0.15)) == 2  # no memory figure: no line


def test_the_script_runs_end_to_end_on_a_scaled_file(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    shape = SHAPES["llama3.1-8b"].scaled(layers=2, hidden=256, ffn=512, vocab=8000)
    path = write_random_gguf(tmp_path / "small.gguf", shape)
    out = subprocess.run(
        [sys.executable, "-m", "bench.kquant_gpu", "--file", str(path), "--backends", "llamacpp",
         "--streams", "1,2", "--tokens", "4", "--ctx", "256"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    assert "small.gguf" in out.stdout and " 2 streams " in out.stdout
    assert any(line.startswith(("PASS ", "FAIL ")) for line in out.stdout.splitlines())
