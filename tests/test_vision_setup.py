"""Where a model's vision projector comes from (issue #37): ``--mmproj FILE``, or an
mmproj*.gguf beside the GGUF; the budget counts it with the weights as the runner measures it;
one found beside a model it does not fit is left out with a warning, not a failed load."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from localinfer.errors import InvalidParameterError
from localinfer.facts.gguf_names import find_projector
from tests.vision_model import MODEL_NAME, PROJECTOR_NAME, cached_vlm, write_projector


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return cached_vlm(tmp_path_factory.mktemp("vlm"))


def test_find_projector(tmp_path: Path) -> None:
    model = tmp_path / "model-Q4_K_M.gguf"
    model.write_bytes(b"GGUF")
    assert find_projector(model, None) is None  # none beside: none, and no error
    with pytest.raises(InvalidParameterError, match="has no mmproj"):
        find_projector(model, "")
    for name in ("mmproj-model-Q8_0.gguf", "mmproj-model-F16.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert find_projector(model, None) == tmp_path / "mmproj-model-F16.gguf"  # F16 first
    assert find_projector(model, "") == tmp_path / "mmproj-model-F16.gguf"
    assert find_projector(model, "mmproj-model-Q8_0.gguf") == tmp_path / "mmproj-model-Q8_0.gguf"
    assert find_projector(model, "none") is None
    elsewhere = tmp_path / "sub" / "vision.gguf"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"GGUF")
    assert find_projector(model, str(elsewhere)) == elsewhere
    with pytest.raises(InvalidParameterError, match="--mmproj: nope.gguf is not a file"):
        find_projector(model, "nope.gguf")


def test_the_budget_counts_the_projector_found_beside(vlm: tuple[Path, Path]) -> None:
    pytest.importorskip("llama_cpp")
    from localinfer.session import open_session

    with open_session(str(vlm[0]), slots=1, ctx=128, threads=1) as with_projector:
        budget = with_projector.budget
        measured = with_projector.engine.runner.memory()
        assert with_projector.engine.runner.vision is not None
    with open_session(str(vlm[0]), slots=1, ctx=128, threads=1, mmproj="none") as without:
        plain = without.budget
        plain_measured = without.engine.runner.memory()
        assert without.engine.runner.vision is None
    assert budget is not None and plain is not None
    assert budget.mmproj == PROJECTOR_NAME and plain.mmproj is None
    projector_bytes = vlm[1].stat().st_size
    added = budget.weights_bytes - plain.weights_bytes
    assert 0.8 * projector_bytes < added <= projector_bytes  # its tensors, not its header
    # The runner measures what the budget predicted (mtmd's own "model size" line).
    assert abs((measured.weights - plain_measured.weights) - added) <= 0.02 * added


def test_a_projector_for_another_model_beside_it_is_left_out(
    vlm: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("llama_cpp")
    from localinfer.session import open_session

    model = tmp_path / MODEL_NAME
    shutil.copy(vlm[0], model)
    write_projector(tmp_path / "mmproj-other-model.gguf", text_width=48)
    with caplog.at_level(logging.WARNING), open_session(str(model), slots=1, ctx=64) as session:
        assert session.engine.runner.vision is None
    assert "mmproj-other-model.gguf not loaded" in caplog.text
    # Asked for by name, the same file is an error.
    with pytest.raises(Exception, match="not a vision projector for this model"):
        open_session(str(model), slots=1, ctx=64, mmproj="mmproj-other-model.gguf")
