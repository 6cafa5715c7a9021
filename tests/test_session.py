"""localinfer.session: the one road from a name to an engine. The budget is asked about exactly
what the runner will be, before any weight loads; what does not fit is refused with the budget's
own explanation, and force (--force) loads it anyway. A draft model's runner takes the same road."""

from __future__ import annotations

import pytest

from localinfer import backend_budget
from localinfer import runner_setup as session_module
from localinfer.budget import compute
from localinfer.budget.memory import DeviceMemory
from localinfer.cli import main
from localinfer.engine import Request, SamplingParams
from localinfer.errors import InvalidParameterError, OutOfMemoryBudgetError
from localinfer.loading.embedded import embedded_model_path
from localinfer.session import RunnerSettings, build_runner, open_model, open_session

TINY = DeviceMemory("cpu", "cpu", 8 * 2**20, 8 * 2**20, "a machine with 8 MiB free")


@pytest.fixture
def tiny_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget sees 8 MiB free, less than the embedded model's weights alone."""
    monkeypatch.setattr(compute, "device_memory", lambda device="auto": TINY)


@pytest.fixture
def budget_requests(monkeypatch: pytest.MonkeyPatch) -> list[compute.BudgetRequest]:
    asked: list[compute.BudgetRequest] = []

    def recording(request: compute.BudgetRequest, **kwargs: object) -> compute.BudgetReport:
        asked.append(request)
        return backend_budget.compute_budget(request, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(session_module, "compute_budget", recording)
    return asked


def test_what_does_not_fit_is_refused_before_any_weight_loads(
    tiny_machine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_weights(*args: object) -> None:
        raise AssertionError("a runner was built for a model the budget refused")

    monkeypatch.setattr(session_module, "create_runner", no_weights)
    with pytest.raises(OutOfMemoryBudgetError) as refused:
        open_session(ctx=64, slots=1)
    # The budget's own sentence, naming the model as the user did and this machine's memory.
    assert str(refused.value).startswith("smollm2-135m at 64 ctx x 1 seq needs ")
    assert "but cpu has 8 MiB" in str(refused.value) and "--force" in str(refused.value)


def test_force_loads_what_the_budget_refuses(tiny_machine: None) -> None:
    with open_session(ctx=64, slots=1, force=True) as s:
        assert s.budget is None
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        assert len(s.engine.generate(Request(s.raw_prompt_ids("Hi"), params)).token_ids) == 2


def test_the_budget_is_asked_about_the_runner_it_lets_in(
    budget_requests: list[compute.BudgetRequest],
) -> None:
    model = open_model(None).model
    built = build_runner(model, RunnerSettings(ctx=96, slots=2, threads=1))
    try:
        (request,) = budget_requests
        config = built.config
        assert (request.ctx, request.concurrency) == (config.max_ctx, config.slots) == (96, 2)
        assert (request.backend, request.device) == (built.choice.name, config.device)
        assert request.dtype == config.dtype == built.choice.profile.default_dtype(config.device)
        assert request.quant is config.quant is None  # the file's own, as the runner holds it
        assert request.model == str(model.path)
        assert built.budget is not None and built.budget.fits
        assert built.budget.model == model.name and built.runner.info.max_ctx == 96
    finally:
        built.runner.close()


def test_a_draft_model_takes_the_same_road(budget_requests: list[compute.BudgetRequest]) -> None:
    with open_session(ctx=64, slots=2, threads=1, draft=str(embedded_model_path())) as s:
        assert s.speculator is not None and s.speculator.kind == "draft"
        target, draft = s.engine.runner.info, s.speculator.draft.runner.info
        assert (draft.slots, draft.max_ctx, draft.dtype) == (
            target.slots,
            target.max_ctx,
            target.dtype,
        )
        assert [(r.ctx, r.concurrency) for r in budget_requests] == [(64, 2), (64, 2)]


def test_context_beyond_training_and_bad_slots_are_one_line_errors() -> None:
    with pytest.raises(InvalidParameterError, match="--slots must be at least 1"):
        open_session(slots=0)
    with pytest.raises(InvalidParameterError, match="was trained for"):
        open_session(ctx=10**7, slots=1)


def test_generate_refuses_without_force_and_runs_with_it(
    tiny_machine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "Hi", "--max-tokens", "2", "--ctx", "64", "--threads", "1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "needs" in err and "--force" in err and "Traceback" not in err
    assert main([*argv, "--force"]) == 0
