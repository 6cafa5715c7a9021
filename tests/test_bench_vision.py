# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""scripts/bench-vision's code end to end on the tiny Gemma 3 (tests/vision_model.py): a real
`localinfer serve` child, the table's rows and the JSON line, and the second turn starting from
the first turn's cells, image included, where another image reuses none of them. No timing is
asserted (the figure itself comes from running the bench on the real-shape model)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.child import child_env, module_argv
from bench.vision_turns import gguf_int
from tests.vision_model import IMAGE_TOKENS, vlm  # noqa: F401 - a fixture

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")
pytestmark = pytest.mark.llamacpp

ROOT = Path(__file__).resolve().parents[1]


def test_bench_vision_table_and_reuse(vlm: tuple[Path, Path]) -> None:
    model, projector = vlm
    argv = module_argv("bench.vision_turns", "--model", str(model), "--mmproj", str(projector),
                       "--repeats", "2", "--threads", "1", "--image-side", "48",
                       "--answer-tokens", "6", "--ctx", "256")  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=child_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    width = gguf_int(model, ".embedding_length")
    assert "median of 2" in lines[0] and f"({width} wide)" in lines[0]
    assert lines[1].split() == ["turn", "prompt", "cached", "prefilled", "TTFT", "vs", "turn", "1"]
    labels = ["1 (new image)", "2 (same image)", "2 (another image: no reuse)"]
    for line, label in zip(lines[2:5], labels, strict=True):
        assert line.startswith(label)
        assert len(line[len(label) :].split()) == 5
    assert lines[5].startswith("turn 2 / turn 1: ") and "target <= 0.30" in lines[5]
    assert "image included: yes" in lines[5]
    assert lines[6].startswith("load average (1, 5, 15 min): ")
    figures = json.loads(lines[7])
    assert len(figures["runs"]) == 2 and len(figures["loadavg"]) == 3
    assert figures["image_reused"]
    for run in figures["runs"]:
        first, second, other = run["first"], run["second"], run["other"]
        # The second turn repeats the first one's whole prompt, the image's tokens included.
        assert second["cached_tokens"] >= first["prompt_tokens"] > IMAGE_TOKENS
        # Another image of the same size: as long a prompt, but nothing from the image on is
        # reused (only the template's tokens before it).
        assert other["prompt_tokens"] == second["prompt_tokens"]
        assert other["cached_tokens"] + IMAGE_TOKENS < first["prompt_tokens"]
        assert all(turn["ttft_s"] > 0 for turn in run.values())
    assert figures["ratio"] == pytest.approx(
        figures["second"]["ttft_ms"] / figures["first"]["ttft_ms"]
    )
