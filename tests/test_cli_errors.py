"""Bad input on the command line (found by exploratory QA): each is one line on stderr and a
non-zero exit, never a traceback, and nothing is loaded that the budget says will not fit."""

from __future__ import annotations

import pytest

from localinfer.cli import main


def test_budget_verify_refuses_what_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    # 100,000 sequences of the embedded model need terabytes: --verify used to build that runner
    # anyway (a 157 GB allocation, a torch traceback; or the OOM killer on a machine that
    # overcommits).
    rc = main(
        ["budget", "smollm2-135m", "--verify", "--concurrency", "100000", "--backend", "torch"]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--verify" in err and "does not fit" in err
