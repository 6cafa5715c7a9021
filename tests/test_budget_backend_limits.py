"""What a backend's runner refuses whatever the memory, refused by the budget first: more
sequences than llama.cpp can hold. The embedded model, budgeted for a planned machine large
enough that memory is never the reason."""

from __future__ import annotations

import pytest

from localinfer.backends.base import RunnerConfig
from localinfer.backends.llamacpp.profile import PROFILE as LLAMACPP
from localinfer.budget import BudgetRequest, compute_budget
from localinfer.cli import main
from localinfer.errors import BackendUnavailableError, InvalidParameterError
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
