"""scripts/bench-reasoning runs end to end on the embedded model (its figures are not asserted:
no test depends on the machine's speed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_bench_prints_both_rates_and_a_verdict() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.reasoning_cost", "--tokens", "8", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("split off" in line for line in lines)
    assert any("split on" in line and ("ok" in line or "MISSED" in line) for line in lines)
