"""llama.cpp on a GPU: every layer there when the model fits, else as many as fit with the rest on
the CPU, said by the budget and passed to the runner (budget/offload.py); planned machines
(`--device metal:16GiB`, `cuda:12GiB`) get the backend and offload that machine would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localinfer import runner_setup
from localinfer.backend_budget import compute_budget
from localinfer.backends.select import BackendChoice
from localinfer.budget.compute import BudgetRequest
from localinfer.budget.file_headers import read_gguf_header
from localinfer.budget.memory import device_memory, planned_device
from localinfer.budget.model_facts import facts_of_loaded
from localinfer.budget.offload import layer_bytes, plan_offload
from localinfer.budget.planner import Breakdown
from localinfer.errors import InvalidParameterError, OutOfMemoryBudgetError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

GiB = 2**30
MiB = 2**20


def budget(model: str, device: str):
    return compute_budget(BudgetRequest(model, device=device))


@pytest.mark.parametrize("device", ["metal:16GiB", "cuda:12GiB"])
def test_an_8b_q4_k_m_fits_wholly_on_a_16gb_mac_and_a_12gb_card(device: str) -> None:
    report = budget("qwen3-8b", device)
    assert report.backend == "llamacpp" and report.fits
    assert report.gpu_layers == report.layers == 36
    assert report.vllm is None


def test_an_8b_on_a_4gb_card_runs_part_of_its_layers_there_and_no_vllm_plan() -> None:
    report = budget("qwen3-8b", "cuda:4GiB")
    assert report.fits and report.vllm is None
    assert 0 < report.gpu_layers < report.layers == 36
    assert f"{report.gpu_layers} of 36 layers on the GPU" in report.offload_text
    assert report.host_bytes > 0 and report.total_bytes - report.host_bytes <= 4 * GiB
    smaller = budget("qwen3-8b", "cuda:3GiB")
    assert smaller.gpu_layers < report.gpu_layers  # less memory, fewer layers


@pytest.mark.parametrize("device", ["metal:16GiB", "cuda:24GiB"])
def test_gemma3_4b_fits_on_llamacpp_where_mlx_and_torch_would_refuse_it(device: str) -> None:
    report = budget("gemma3-4b", device)
    assert report.backend == "llamacpp" and report.fits and report.gpu_layers == report.layers


def test_planned_devices_parse_with_their_kind() -> None:
    mac = device_memory("metal:16GiB")
    assert (mac.kind, mac.total, mac.planned) == ("metal", 16 * GiB, True)
    assert mac.available == int(16 * GiB * 0.75)  # Metal's working set
    assert device_memory("cuda:12GiB").available == 12 * GiB
    assert device_memory("cpu:32GiB").kind == "cpu"
    assert budget("qwen3-8b", "cpu:32GiB").backend == "llamacpp"  # not this CPU's measured rule
    with pytest.raises(InvalidParameterError, match="metal:16GiB"):
        device_memory("tpu:16GiB")


def embedded_facts():
    return facts_of_loaded(load_model(embedded_model_path()))


def test_layer_bytes_from_the_header_add_up_to_the_file() -> None:
    facts = embedded_facts()
    header = read_gguf_header(embedded_model_path())
    split = layer_bytes(facts, header.weight_bytes)
    assert len(split.layers) == facts.arch.n_layers and min(split.layers) > 0
    assert sum(split.layers) + split.embedding + split.head == header.weight_bytes
    # SmolLM2 ties its head to the embedding table: llama.cpp copies it to the GPU with all.
    assert split.head_copy == split.embedding > 0


def parts(weights: int, kv: int = 64 * MiB) -> Breakdown:
    return Breakdown(weights, "", kv, compute=32 * MiB, runtime=100 * MiB)


def test_the_plan_takes_the_most_layers_that_fit() -> None:
    facts = embedded_facts()
    header = read_gguf_header(embedded_model_path())
    split = layer_bytes(facts, header.weight_bytes)
    whole = parts(header.weight_bytes)
    full = plan_offload(whole, split, 10 * GiB)
    assert full.gpu_layers == full.layers
    assert full.host_bytes == split.embedding  # only the table the CPU gathers from
    counts = [plan_offload(whole, split, m * MiB).gpu_layers for m in range(130, 330, 10)]
    assert counts == sorted(counts) and 0 < counts[3] < full.layers  # monotonic, partial seen
    none = plan_offload(whole, split, 100 * MiB)  # the runtime alone fills it
    assert none.gpu_layers == 0


def test_a_partial_plan_counts_what_stays_on_the_host() -> None:
    facts = embedded_facts()
    header = read_gguf_header(embedded_model_path())
    split = layer_bytes(facts, header.weight_bytes)
    whole = parts(header.weight_bytes, kv=facts.arch.n_layers * MiB)
    plan = plan_offload(whole, split, 200 * MiB)
    assert 0 < plan.gpu_layers < plan.layers
    cpu_layers = plan.layers - plan.gpu_layers
    expected = split.embedding + split.head + sum(split.layers[:cpu_layers]) + cpu_layers * MiB
    assert plan.host_bytes == expected


def test_build_runner_hands_the_budgeted_layers_to_llamacpp(monkeypatch) -> None:
    """A GPU too small for the embedded model: the runner is asked for the layers that fit."""
    captured = {}

    def fake_runner(model, config, choice):
        captured["config"], captured["choice"] = config, choice
        return object()

    monkeypatch.setattr(
        runner_setup, "choose_backend", lambda *a: BackendChoice("llamacpp", "test", "cuda")
    )
    monkeypatch.setattr(runner_setup, "create_runner", fake_runner)
    model = load_model(embedded_model_path())
    settings = runner_setup.RunnerSettings(ctx=512, slots=1)
    for size in range(300, 700, 20):  # the smallest card that takes some layers
        memory = planned_device("cuda", size * MiB)
        try:
            built = runner_setup.build_runner(model, replace(settings, memory=memory))
        except OutOfMemoryBudgetError:  # too small: not one layer fits
            continue
        if built.budget.gpu_layers < built.budget.layers:
            assert captured["config"].gpu_layers == built.budget.gpu_layers > 0
            assert "layers on the GPU" in captured["choice"].reason
            return
    pytest.fail("no size gave a partial offload")
