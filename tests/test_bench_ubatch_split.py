"""bench/ubatch_split.py end to end on the embedded model: a row per flash-attention setting."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llama_cpp")


def test_prints_the_wave_and_every_depth_for_both_kernels(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import ubatch_split

    # The wave's shape is the script's: four fresh prompts of 7-10 tokens (four ubatches) beside
    # four cached sequences taking one token each (a fifth). How many cells those four hold only
    # sets their positions, so a few cells each stand in for the script's 63-83, whose prefill
    # (297 tokens per kernel) was most of this test's cost.
    monkeypatch.setattr(ubatch_split, "WAVE_CACHED", {4: 9, 5: 6, 6: 9, 7: 7})
    # Two shallow depths: a row per depth is what is checked, and each depth first prefills 8
    # sequences to it (8 x 56 tokens for 16,40 per kernel, 8 x 7 for 2,5).
    assert ubatch_split.main(["--threads", "1", "--repeats", "1", "--depths", "2,5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["flash attention on ", "flash attention off"]
    for line in lines:
        assert re.search(r"wave \d+\.\d ms, 8x1 at 2: \d+\.\d ms, 8x1 at 5: \d+\.\d ms$", line)
