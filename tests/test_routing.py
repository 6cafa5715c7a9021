"""The routing table: file format x architecture x device -> runner, with simulated devices and
installs (backends/routing.py), and choose_backend / the budget's plan following it."""

from __future__ import annotations

import pytest

from localinfer.backends import routing, select
from localinfer.backends.llamacpp.offload import ALL_LAYERS, gpu_layer_count
from localinfer.backends.select import backend_profile, choose_backend, planned_backend
from localinfer.errors import BackendUnavailableError

EVERYTHING = ("torch", "llamacpp", "mlx")


def route(kind: str, fmt: str | None, arch: str | None, installed=EVERYTHING, offloads=True):
    return routing.gpu_route(
        kind, fmt, arch, backend_profile, lambda name: name in installed, offloads
    )


# (device, format, arch, llama.cpp GPU build) -> (backend, device); None: no GPU runner.
TABLE = [
    ("cuda", "gguf", "qwen3", True, ("llamacpp", "cuda")),
    ("cuda", "gguf", "gemma3", True, ("llamacpp", "cuda")),
    ("cuda", "gguf", "qwen3", False, ("torch", "cuda")),  # CPU-only llama.cpp wheel
    ("cuda", "gguf", "gemma3", False, None),  # torch lacks gemma3: not sent there
    ("cuda", "gguf", "qwen3moe", False, None),
    ("cuda", "safetensors", "llama", True, ("torch", "cuda")),
    ("cuda", "safetensors", "phi3", True, None),
    ("metal", "gguf", "qwen3", True, ("llamacpp", "metal")),
    ("metal", "gguf", "gemma3", True, ("llamacpp", "metal")),
    ("metal", "gguf", "qwen3", False, ("mlx", "metal")),
    ("metal", "gguf", "phi3", False, None),
    ("metal", "safetensors", "qwen2", True, ("mlx", "metal")),  # MLX-format repos too
    ("metal", "safetensors", "gemma3", True, None),
]


@pytest.mark.parametrize(("kind", "fmt", "arch", "offloads", "want"), TABLE)
def test_the_routing_table(kind, fmt, arch, offloads, want) -> None:
    got = route(kind, fmt, arch, offloads=offloads)
    assert (None if got is None else (got.backend, got.device)) == want


def test_a_runner_that_is_not_installed_is_not_chosen() -> None:
    assert route("cuda", "gguf", "qwen3", installed=("torch",)).backend == "torch"
    assert route("cuda", "gguf", "qwen3", installed=("mlx",)) is None
    assert route("metal", "safetensors", "llama", installed=("llamacpp",)) is None


def test_the_reason_names_the_device_and_the_offload() -> None:
    assert "every layer on the GPU" in route("cuda", "gguf", "qwen3").reason
    assert "no GPU build" in route("cuda", "gguf", "qwen3", offloads=False).reason


def simulate(monkeypatch, gpu: str | None, installed=EVERYTHING, offloads=True) -> None:
    monkeypatch.setattr(select, "gpu_kind", lambda: gpu)
    monkeypatch.setattr(select, "llamacpp_offloads", lambda: offloads)
    monkeypatch.setattr(select, "is_installed", lambda name: name in installed)
    monkeypatch.setattr(select, "_has_mlx_runner", lambda: True)
    monkeypatch.setattr(select, "_native_blocks_preferred", lambda quant, arch: False)


def test_choose_backend_routes_a_gguf_to_llamacpp_on_the_gpu(monkeypatch) -> None:
    simulate(monkeypatch, "cuda")
    choice = choose_backend(None, "gguf", "Q4_K_M", "gemma3")
    assert (choice.name, choice.device) == ("llamacpp", "cuda")
    simulate(monkeypatch, "metal")
    choice = choose_backend(None, "gguf", "Q4_K_M", "qwen3moe")
    assert (choice.name, choice.device) == ("llamacpp", "metal")
    choice = choose_backend(None, "safetensors", "bf16", "qwen3")
    assert (choice.name, choice.device) == ("mlx", "metal")


def test_no_gpu_runner_falls_back_to_the_cpu_and_says_how_to_fix_it(monkeypatch) -> None:
    simulate(monkeypatch, "cuda", offloads=False)
    choice = choose_backend(None, "gguf", "Q4_K_M", "gemma3")
    assert (choice.name, choice.device) == ("llamacpp", "cpu")
    assert "GGML_CUDA=on" in choice.reason
    simulate(monkeypatch, "metal")
    choice = choose_backend(None, "safetensors", "bf16", "gemma3")
    assert (choice.name, choice.device) == ("torch", "cpu")
    assert "does not implement 'gemma3'" in choice.reason


def test_backend_requested_runs_on_its_gpu_when_it_has_one(monkeypatch) -> None:
    simulate(monkeypatch, "cuda")
    assert choose_backend("llamacpp").device == "cuda"
    assert choose_backend("torch").device == "cuda"
    simulate(monkeypatch, "cuda", offloads=False)
    assert choose_backend("llamacpp").device == "cpu"
    simulate(monkeypatch, None)
    assert choose_backend("llamacpp").device == "cpu"


def test_the_budget_plans_the_same_routes_for_a_machine_that_is_not_this_one() -> None:
    assert planned_backend("cuda", None, "gguf", "Q4_K_M", "qwen3") == "llamacpp"
    assert planned_backend("metal", None, "gguf", "Q4_K_M", "gemma3") == "llamacpp"
    assert planned_backend("cuda", None, "safetensors", "bf16", "qwen3") == "torch"
    assert planned_backend("metal", None, "safetensors", "bf16", "llama") == "mlx"
    assert planned_backend("planned", None, "gguf", "Q4_K_M", "qwen3") == "llamacpp"
    assert planned_backend("cuda", "torch", "gguf", "Q4_K_M", "qwen3") == "torch"


def test_profiles_name_the_architectures_their_runners_implement() -> None:
    from localinfer.backends.mlx.model import MLX_ARCHS
    from localinfer.backends.torch.profile import TORCH_ARCHS

    assert backend_profile("mlx").archs == MLX_ARCHS
    assert backend_profile("torch").archs == TORCH_ARCHS
    assert backend_profile("llamacpp").archs is None


def test_llamacpp_gpu_layers_from_the_config() -> None:
    assert gpu_layer_count("cpu", None, True) == 0
    assert gpu_layer_count("cuda", None, True) == ALL_LAYERS
    assert gpu_layer_count("cuda:1", 22, True) == 22
    assert gpu_layer_count("metal", None, True) == ALL_LAYERS
    with pytest.raises(BackendUnavailableError, match="GGML_METAL=on"):
        gpu_layer_count("metal", None, False)
