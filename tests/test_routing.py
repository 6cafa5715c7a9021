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


# Matrix types of the files routed, with their stored bytes (a Q4_K_M keeps its LM head and
# half its down projections at Q6_K; only which type holds the most bytes counts).
Q4_K_M = {"Q4_K": 600, "Q6_K": 300}
Q8_0 = {"Q8_0": 1000}
Q4_0 = {"Q4_0": 900, "Q6_K": 100}  # llama.cpp keeps a Q4_0 file's LM head at Q6_K
BF16 = {"BF16": 1000}
AS_STORED = "as stored"  # llama.cpp: every matrix in the file's own blocks
TORCH_KQUANT = {"Q4_K": "int4-g32", "Q6_K": "int8"}

# (device, format, arch, the file's matrices, llama.cpp GPU build) ->
# (backend, device, the form each stored type is held in); None: no GPU runner.
TABLE = [
    ("cuda", "gguf", "qwen3", Q4_K_M, True, ("llamacpp", "cuda", AS_STORED)),
    ("cuda", "gguf", "gemma3", Q8_0, True, ("llamacpp", "cuda", AS_STORED)),
    # CPU-only llama.cpp wheel: torch holds Q4_K as int4 groups of 32, Q6_K as int8
    ("cuda", "gguf", "qwen3", Q4_K_M, False, ("torch", "cuda", TORCH_KQUANT)),
    # not K-quant files: converted by the same rules (no native CPU kernels keep their blocks)
    ("cuda", "gguf", "qwen3", Q8_0, False, ("torch", "cuda", {"Q8_0": "int8"})),
    ("cuda", "gguf", "llama", Q4_0, False,
     ("torch", "cuda", {"Q4_0": "int4-g32", "Q6_K": "int8"})),
    ("cuda", "gguf", "gemma3", Q4_K_M, False, None),  # torch lacks gemma3: not sent there
    ("cuda", "gguf", "qwen3moe", Q4_K_M, False, None),
    ("cuda", "safetensors", "llama", BF16, True, ("torch", "cuda", {"BF16": "bf16"})),
    ("cuda", "safetensors", "phi3", BF16, True, None),
    ("metal", "gguf", "qwen3", Q4_K_M, True, ("llamacpp", "metal", AS_STORED)),
    ("metal", "gguf", "gemma3", Q4_K_M, True, ("llamacpp", "metal", AS_STORED)),
    ("metal", "gguf", "qwen3", Q4_K_M, False,
     ("mlx", "metal", {"Q4_K": "mlx-4bit-g32", "Q6_K": "mlx-8bit-g32"})),
    ("metal", "gguf", "llama", Q8_0, False, ("mlx", "metal", {"Q8_0": "mlx-8bit-g32"})),
    ("metal", "gguf", "phi3", Q4_K_M, False, None),
    ("metal", "safetensors", "qwen2", BF16, True, ("mlx", "metal", {"BF16": "bf16"})),
    ("metal", "safetensors", "gemma3", BF16, True, None),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "fmt", "arch", "stored", "offloads", "want"), TABLE)
def test_the_routing_table(kind, fmt, arch, stored, offloads, want) -> None:
    """The runner, its device, and the form it holds the file's matrices in there (its
    profile's rule, as the budget's plan reports it: BudgetReport.weight_forms)."""
    got = route(kind, fmt, arch, offloads=offloads)
    if got is None:
        assert want is None
        return
    profile = backend_profile(got.backend)
    forms = profile.weight_forms(stored, got.device, profile.default_dtype(got.device))
    backend, device, want_forms = want
    assert (got.backend, got.device) == (backend, device)
    assert forms == ({t: t for t in stored} if want_forms == AS_STORED else want_forms)


@pytest.mark.parametrize(
    ("device", "backend", "forms"),
    [
        ("metal:16GiB", None, {"Q4_1": "Q4_1", "Q8_0": "Q8_0"}),  # llama.cpp, as stored
        ("metal:16GiB", "mlx", {"Q4_1": "mlx-4bit-g32", "Q8_0": "mlx-8bit-g32"}),
        ("cuda:12GiB", "torch", {"Q4_1": "int4-g32", "Q8_0": "int8"}),  # as a K-quant file's
    ],
)
def test_the_budget_reports_the_form_its_planned_runner_holds(device, backend, forms) -> None:
    """The budget's plan for a machine that is not this one carries the same rule: the embedded
    Q4_1 file (its table Q8_0), read from its header."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest
    from localinfer.loading.embedded import embedded_model_path

    request = BudgetRequest(str(embedded_model_path()), backend=backend, device=device)
    assert compute_budget(request).weight_forms == forms


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
