"""python -m bench.omp_teams: two llama.cpp engines in one process, under each wait setting, in
fresh processes (libgomp reads its variables once)."""

from __future__ import annotations

import subprocess

import pytest

from bench.child import child_env, module_argv

pytestmark = pytest.mark.llamacpp


def test_prints_each_setting_with_a_time_per_answer() -> None:
    pytest.importorskip("llama_cpp")
    done = subprocess.run(module_argv("bench.omp_teams", "--tokens", "2", "--threads", "1"),
                          capture_output=True, text=True, timeout=600, env=child_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.splitlines()[1:]
    assert [r.split("  ")[0] for r in rows] == ["localinfer's (spin count + ACTIVE)",
                                                 "spin count alone"]  # fmt: skip
    for row in rows:
        cells = row.split()[-10:]
        assert cells[::2] == ["A", "A", "B", "A", "B"]
        assert all(float(t) > 0 for t in cells[1::2])
