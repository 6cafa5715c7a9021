"""python -m bench.runner_host_time: the llama.cpp runner's Python per decode step, at 1 and at
N sequences, and the runner module's llama_decode call put back afterwards."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from bench import runner_host_time  # noqa: E402
from localinfer.backends.llamacpp import runner as runner_module  # noqa: E402


def test_prints_a_row_per_sequence_count(capsys: pytest.CaptureFixture[str]) -> None:
    before = runner_module.decode_checked
    argv = ["--slots", "2", "--depth", "4", "--steps", "3", "--rounds", "1", "--threads", "1"]
    assert runner_host_time.main(argv) == 0
    assert runner_module.decode_checked is before
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "2"]
    for _, step, host, _share in rows:
        assert 0 < float(host) < float(step)  # the decode itself is timed apart
