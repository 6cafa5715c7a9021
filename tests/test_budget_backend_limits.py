"""What a backend's runner refuses whatever the memory, refused by the budget first: more
sequences than llama.cpp can hold, and weight quantizations a runner cannot make. The embedded
model, budgeted for a planned machine large enough that memory is never the reason."""

from __future__ import annotations

import pytest

from localinfer.backend_budget import compute_budget
from localinfer.backends.base import RunnerConfig
from localinfer.backends.llamacpp.profile import PROFILE as LLAMACPP
from localinfer.backends.torch.profile import PROFILE as TORCH
from localinfer.budget import BudgetRequest
from localinfer.cli import main
from localinfer.errors import (
    BackendUnavailableError,
    InvalidParameterError,
    UnsupportedModelError,
)
from localinfer.loading.embedded import embedded_model_path

BIG = "512GiB"  # a planned machine: memory never limits these requests


def test_llamacpp_sequence_limit_is_llama_cpps_own() -> None:
    """The profile's 256 is what the installed llama.cpp enforces: one more fails to create."""
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.session import open_model

    model = open_model(str(embedded_model_path())).model
    assert LLAMACPP.max_sequences == 256
    too_many = RunnerConfig(slots=LLAMACPP.max_sequences + 1, max_ctx=16)
    with pytest.raises(BackendUnavailableError, match=f"n_seq_max must be <= {256}"):
        LlamaCppRunner(model, too_many)


def test_most_sequences_stops_at_llamacpps_limit() -> None:
    report = compute_budget(BudgetRequest("smollm2-135m", backend="llamacpp", device=BIG))
    assert report.fits and report.max_concurrency == 256
    # The same memory on torch: no such limit, memory (or the search's end) decides.
    torch = compute_budget(BudgetRequest("smollm2-135m", backend="torch", device=BIG))
    assert torch.max_concurrency > 256


def test_more_sequences_than_llamacpp_holds_is_refused() -> None:
    at_limit = BudgetRequest("smollm2-135m", concurrency=256, backend="llamacpp", device=BIG)
    assert compute_budget(at_limit).fits
    over = BudgetRequest("smollm2-135m", concurrency=257, backend="llamacpp", device=BIG)
    with pytest.raises(InvalidParameterError, match="llamacpp backend runs at most 256") as exc:
        compute_budget(over)
    assert "257" in str(exc.value)


def test_cli_refuses_400_sequences_on_llamacpp(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["budget", "smollm2-135m", "--backend", "llamacpp", "--concurrency", "400"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1
    assert "at most 256 sequences" in err and "400" in err


@pytest.mark.parametrize("backend", ["llamacpp", "torch"])
@pytest.mark.parametrize("quant", ["mlx-4bit", "mlx-8bit"])
def test_mlx_quant_on_another_backend_is_refused(backend: str, quant: str) -> None:
    request = BudgetRequest("smollm2-135m", quant=quant, backend=backend, device=BIG)
    with pytest.raises(UnsupportedModelError, match=quant):
        compute_budget(request)


def test_mlx_quant_on_mlx_is_budgeted() -> None:
    request = BudgetRequest("smollm2-135m", quant="mlx-4bit", backend="mlx", device=BIG)
    assert compute_budget(request).quant == "mlx-4bit"


def test_budget_refusal_is_the_llamacpp_runners() -> None:
    """Word for word what LlamaCppRunner raises for the same name and file."""
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.session import open_model

    model = open_model(str(embedded_model_path())).model
    with pytest.raises(UnsupportedModelError) as runner:
        LlamaCppRunner(model, RunnerConfig(max_ctx=16, quant="mlx-4bit"))
    request = BudgetRequest("smollm2-135m", quant="mlx-4bit", backend="llamacpp", device=BIG)
    with pytest.raises(UnsupportedModelError) as budget:
        compute_budget(request)
    assert str(budget.value) == str(runner.value)


@pytest.mark.parametrize(
    "quant",
    [
        "mlx-4bit",
        "mlx-8bit",
        "mlx-4bit-g32",
        "int8",
        "int4",
        "int4-g32",
        "int4-g128",
        "int4-g16",  # a group size the quantizer does not make: it was budgeted as fitting
        "int8-g7",
        "bf16",
        "f32",
    ],
)
def test_torch_refusal_matches_its_parser(quant: str) -> None:
    """The profile (torch-free) refuses exactly the names quant_layout.parse_quant refuses."""
    from localinfer.backends.torch.quant_layout import parse_quant

    try:
        parse_quant(quant)
        refused = None
    except UnsupportedModelError as exc:
        refused = str(exc)
    assert TORCH.quant_refusal(quant, "Q4_1") == refused


def test_cli_refuses_mlx_quant_on_llamacpp(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["budget", "smollm2-135m", "--quant", "mlx-4bit", "--backend", "llamacpp"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1
    assert "runs a GGUF as stored" in err
