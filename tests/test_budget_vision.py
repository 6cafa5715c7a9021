# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""The budget's vision encoder (issue #37, localinfer/budget/vision.py): the projector's compute
buffer, work buffer and per-image memory from its header, how many tokens of the context an
image is, and `budget --verify --mmproj` measuring the process's growth while the runner loads
the projector and encodes one image: on the tiny random Gemma 3 (tests/vision_model.py) and on
a projector of Gemma 3's SigLIP shape with random weights (bench/random_mmproj.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from bench.random_mmproj import GEMMA3_SIGLIP, cached_pair
from localinfer.backend_budget import compute_budget
from localinfer.budget.file_headers import read_projector
from localinfer.budget.render import breakdown_table, vision_note
from localinfer.budget.report import BudgetReport, BudgetRequest
from localinfer.budget.vision import (
    VisionShape,
    graph_bytes,
    shape_from_dict,
    vision_cost,
    work_bytes,
)
from localinfer.cli import main
from tests.vision_model import (
    IMAGE_TOKENS,
    vlm,  # noqa: F401 - a fixture
)

# Gemma 3's encoder: 64 x 64 patches of an 896x896 image, 1,152 wide, an MLP of 4,304.
GEMMA3 = VisionShape("gemma3", 896, 14, 1152, 4304, 27, 2560, 4, False, 2.0, 1152 * 2560 * 2)
TWO_LAYERS = dataclasses.replace(GEMMA3_SIGLIP, layers=2)


def budget(model: Path, mmproj: str | None = "", device: str = "cpu") -> BudgetReport:
    request = BudgetRequest(str(model), mmproj=mmproj, device=device, backend="llamacpp")
    return compute_budget(request)


def test_the_graph_is_the_mlp_stage_with_the_hole_between_layers() -> None:
    # mtmd logs 121.25 MiB for this encoder (2 to 27 layers, projections 64 to 5,376 wide).
    assert graph_bytes(GEMMA3) == 4096 * (4304 + 3 * 1152) * 4 == 127_139_840
    assert GEMMA3.image_tokens == 256 and GEMMA3.patches == 4096
    # An MLP twice the width or narrower: the attention's residual, Q, K, V and K/V in f16.
    narrow = dataclasses.replace(GEMMA3, ffn=2 * 1152)
    assert graph_bytes(narrow) == 4096 * 5 * 1152 * 4
    # A projection copy wider than the hole an encoder leaves comes on top of the MLP's stage.
    small = dataclasses.replace(GEMMA3, image_size=224, hidden=256, ffn=960, projection_copy=2**22)
    assert graph_bytes(small) == 256 * (960 + 2 * 256) * 4 + 2**22


def test_the_cpu_converts_the_mlp_input_and_a_gpu_holds_only_the_graph() -> None:
    on_cpu, on_gpu = vision_cost(GEMMA3, "cpu"), vision_cost(GEMMA3, "cuda")
    assert on_cpu.work == 4096 * 4304 * 2  # the down projection's input in f16
    assert on_cpu.image > 3 * 896 * 896 * 4 + 2 * 256 * 2560 * 4  # pixels, embeddings twice
    assert on_gpu.total == on_gpu.graph == on_cpu.graph
    assert [work_bytes(t) for t in ("F32", "F16", "Q8_0", "Q4_K")] == [0, 2, 34 / 32, 292 / 256]


def test_the_shape_survives_the_hub_metadata_cache() -> None:
    assert shape_from_dict(GEMMA3.as_dict()) == GEMMA3
    assert shape_from_dict(None) is None
    assert shape_from_dict({"projector_type": "gemma3"}) is None  # a cache of other fields


def test_the_projector_header_gives_the_encoder_shape(vlm: tuple[Path, Path]) -> None:
    projector = read_projector(vlm[1], vlm[1].name)
    shape = projector.vision
    assert shape is not None and shape.projector_type == "gemma3"
    assert (shape.image_size, shape.patch_size, shape.hidden, shape.merge) == (32, 4, 32, 2)
    assert shape.image_tokens == IMAGE_TOKENS and shape.work_bytes == 0  # all F32
    assert shape.projection_copy == 32 * 64 * 4  # mm.input_projection, F32 here


def test_budget_counts_the_encoder_with_compute(vlm: tuple[Path, Path]) -> None:
    plain, counted = budget(vlm[0], None), budget(vlm[0])
    vision = counted.vision
    assert plain.vision is None and vision is not None
    assert counted.weights_bytes - plain.weights_bytes == vision.projector_bytes
    assert counted.compute_bytes - plain.compute_bytes == vision.compute_bytes
    shape = read_projector(vlm[1], vlm[1].name).vision
    assert shape is not None and vision.compute_bytes == vision_cost(shape, "cpu").total
    assert vision.image_tokens == IMAGE_TOKENS
    console = Console(width=200, record=True)
    console.print(breakdown_table(counted))
    table = console.export_text()
    assert "vision encoder" in table and "gemma3 graph at 32x32 (64 patches)" in table
    assert vision_note(counted) is not None
    assert "an image is 16 tokens of the context" in vision_note(counted)
    assert vision_note(plain) is None


def test_on_a_gpu_the_encoder_is_its_graph(vlm: tuple[Path, Path]) -> None:
    report = budget(vlm[0], device="cuda:8GiB")
    assert report.vision is not None
    assert report.vision.compute_bytes == report.vision.graph_bytes == 64 * 5 * 32 * 4


@pytest.mark.llamacpp
def test_the_graph_is_the_buffer_mtmd_reserves(vlm: tuple[Path, Path]) -> None:
    """mtmd logs its compute buffer in MiB to two decimals: the prediction within that; and a
    prompt's image is as many tokens as the budget says."""
    pytest.importorskip("llama_cpp")
    from tests.test_llamacpp_vision import IMAGE_MARKER, rgb, runner

    for model, projector in (vlm, cached_pair(TWO_LAYERS)):
        shape = read_projector(projector, projector.name).vision
        assert shape is not None
        run = runner((model, projector), slots=1)
        try:
            assert run.vision is not None
            assert abs(run.vision.compute_bytes - graph_bytes(shape)) <= 0.005 * 2**20
            prompt = run.vision.prompt(IMAGE_MARKER, [rgb(0)], None)
            assert prompt.images[0].n_tokens == shape.image_tokens
        finally:
            run.close()


def verify(model: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    argv = ["budget", str(model), "--mmproj", "", "--device", "cpu", "--backend", "llamacpp"]
    assert main([*argv, "--verify", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["verify"]


def assert_within_ten_percent(check: dict[str, int]) -> None:
    predicted, measured = check["predicted_projector"], check["measured_projector"]
    assert predicted and measured, check
    assert abs(measured / predicted - 1) <= 0.10, (measured / predicted, check)


# The process's RSS growth is the measure: in a test process that has loaded other models first
# it reads high (2.8x seen), so these run by scripts/test --all, each in a process of its own.
@pytest.mark.slow
@pytest.mark.llamacpp
def test_verify_measures_the_tiny_projector(
    vlm: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny projector is mtmd's own tables more than its weights or buffers."""
    pytest.importorskip("llama_cpp")
    assert_within_ten_percent(verify(vlm[0], capsys))


@pytest.mark.slow
@pytest.mark.llamacpp
def test_verify_measures_a_gemma3_shaped_projector(capsys: pytest.CaptureFixture[str]) -> None:
    """Two of Gemma 3's encoder layers: its buffers outweigh its weights (88 MiB of 270)."""
    pytest.importorskip("llama_cpp")
    assert_within_ten_percent(verify(cached_pair(TWO_LAYERS)[0], capsys))


@pytest.mark.slow  # writes an 812 MiB projector once, and encodes an image through 27 layers
@pytest.mark.llamacpp
def test_verify_measures_gemma3s_whole_projector(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llama_cpp")
    assert_within_ten_percent(verify(cached_pair(GEMMA3_SIGLIP)[0], capsys))
