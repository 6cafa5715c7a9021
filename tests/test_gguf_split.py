"""A split GGUF (llama.cpp's gguf-split: NAME-00001-of-0000N.gguf ...) runs from its first part's
path, as llama.cpp runs it: the embedded model cut into three parts loads as the same model,
gives the same logits on llama.cpp and torch, and has the same budget. A later part, a missing
part or a misnamed set is one line naming what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from localinfer.backend_budget import compute_budget
from localinfer.backends.base import SlotWork
from localinfer.budget import BudgetRequest
from localinfer.budget.file_headers import read_gguf_header
from localinfer.errors import ModelFileError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.gguf_split import gguf_part_paths
from localinfer.loading.loader import load_model
from localinfer.resolve import resolve_model
from localinfer.session import RunnerSettings, build_runner, open_model
from tests.gguf_split_writer import write_split_gguf

N_PARTS = 3


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_split_gguf(embedded_model_path(), tmp_path_factory.mktemp("split"), N_PARTS)


def test_the_parts_hold_the_model_between_them(parts: list[Path]) -> None:
    assert [p.name.rsplit("-", 3)[1:] for p in parts] == [
        ["00001", "of", "00003.gguf"],
        ["00002", "of", "00003.gguf"],
        ["00003", "of", "00003.gguf"],
    ]
    whole = load_model(embedded_model_path())
    split = load_model(parts[0])
    assert split.config == whole.config and split.file_quant == whole.file_quant
    assert split.weights.names() == whole.weights.names()
    assert split.weights.nbytes() == whole.weights.nbytes()
    for name in whole.weights.names():  # every tensor read from its own part, byte for byte
        assert np.array_equal(split.weights.raw(name), whole.weights.raw(name)), name
    assert split.tokenizer.encode("Hello, split world") == whole.tokenizer.encode(
        "Hello, split world"
    )
    assert split.chat_template.source == whole.chat_template.source


def test_the_parts_of_a_set_by_name(parts: list[Path]) -> None:
    assert gguf_part_paths(parts[0]) == parts == gguf_part_paths(parts[2])
    assert gguf_part_paths(embedded_model_path()) == [embedded_model_path()]


def test_a_folder_holding_the_set_resolves_to_its_first_part(
    parts: list[Path], tmp_path: Path
) -> None:
    for part in parts:
        shutil.copy(part, tmp_path / part.name)
    resolved = resolve_model(str(tmp_path))
    assert resolved.kind == "gguf" and resolved.path == tmp_path / parts[0].name


@pytest.fixture(scope="module")
def tiny_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A tiny random llama in the embedded model's Q4_1, whole and cut into three parts: what
    each backend loads from the parts is the file's (the embedded set proves the bytes above);
    building three backends' runners of the 135M model twice over would prove no more."""
    import gguf

    from tests.model_files import tiny_chat_gguf

    folder = tmp_path_factory.mktemp("tiny-split")
    whole = tiny_chat_gguf(folder, "tiny-Q4_1.gguf", gguf.GGMLQuantizationType.Q4_1)
    (folder / "parts").mkdir()
    return whole, write_split_gguf(whole, folder / "parts", N_PARTS)


@pytest.mark.parametrize("backend", ["llamacpp", "torch", "mlx"])
def test_the_split_set_runs_as_the_whole_file(
    tiny_parts: tuple[Path, list[Path]], backend: str
) -> None:
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    whole, parts = tiny_parts
    assert len(parts) == N_PARTS and load_model(parts[0]).file_quant == "Q4_1"
    settings = RunnerSettings(backend=backend, ctx=256, slots=1, threads=1)
    logits, budgets = [], []
    for spec in (whole, parts[0]):
        built = build_runner(open_model(str(spec)).model, settings)
        assert built.budget is not None
        logits.append(built.runner.forward([SlotWork(0, tuple(range(100, 120)), 0)])[0])
        budgets.append((built.budget.weights_bytes, built.budget.total_bytes))
        built.runner.close()
    np.testing.assert_allclose(logits[1], logits[0], rtol=0, atol=1e-5)
    assert budgets[1] == budgets[0]  # the budget the runner was admitted by


def test_the_budget_of_the_set_is_the_whole_files(parts: list[Path]) -> None:
    whole, split = read_gguf_header(embedded_model_path()), read_gguf_header(parts[0])
    assert split.weight_bytes == whole.weight_bytes and split.params == whole.params
    assert split.arch == whole.arch
    for backend in ("llamacpp", "torch"):
        reports = [
            compute_budget(BudgetRequest(str(p), ctx=2048, backend=backend, device="8GiB"))
            for p in (embedded_model_path(), parts[0])
        ]
        for field in ("params", "weights_bytes", "kv_cache_bytes", "compute_bytes", "total_bytes"):
            assert getattr(reports[0], field) == getattr(reports[1], field), (backend, field)


def test_a_later_part_names_the_first(parts: list[Path]) -> None:
    with pytest.raises(ModelFileError, match=f"is part 2 of a split GGUF; open .*{parts[0].name}"):
        load_model(parts[1])


def test_a_missing_part_is_named(parts: list[Path], tmp_path: Path) -> None:
    shutil.copy(parts[0], tmp_path / parts[0].name)
    shutil.copy(parts[2], tmp_path / parts[2].name)
    with pytest.raises(ModelFileError, match=f"{parts[1].name}: missing part of a split GGUF"):
        load_model(tmp_path / parts[0].name)
    with pytest.raises(ModelFileError, match="missing part of a split GGUF"):
        read_gguf_header(tmp_path / parts[0].name)


def test_a_set_not_named_as_one(parts: list[Path], tmp_path: Path) -> None:
    renamed = tmp_path / "model.gguf"
    shutil.copy(parts[0], renamed)
    with pytest.raises(ModelFileError, match="first of 3 parts of a split GGUF but not named"):
        load_model(renamed)
    # Parts out of order: the second file says it is the third.
    for number, part in ((1, parts[0]), (2, parts[2]), (3, parts[1])):
        shutil.copy(part, tmp_path / f"m-{number:05d}-of-00003.gguf")
    with pytest.raises(ModelFileError, match="'split.no' is 2, not 1"):
        load_model(tmp_path / "m-00001-of-00003.gguf")
