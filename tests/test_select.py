"""Backend selection: the default order, --backend, missing installs, GGUF-only llama.cpp."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localinfer.backends import select
from localinfer.backends.base import Runner, RunnerConfig
from localinfer.errors import BackendUnavailableError, UnsupportedModelError


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Pretend to be a machine: which packages are installed, Apple Silicon, an NVIDIA GPU."""

    def configure(
        installed: set[str],
        apple: bool = False,
        nvidia: bool = False,
        mlx_runner: bool = True,
        offloads: bool = False,  # llama.cpp built with the GPU's backend (a CPU wheel: False)
    ) -> None:
        monkeypatch.setattr(select, "is_installed", lambda name: name in installed)
        monkeypatch.setattr(select, "llamacpp_offloads", lambda: offloads)
        monkeypatch.setattr(select, "is_apple_silicon", lambda: apple)
        monkeypatch.setattr(select, "has_nvidia_gpu", lambda: nvidia)
        monkeypatch.setattr(select, "_has_mlx_runner", lambda: mlx_runner)

    return configure


def test_apple_silicon_picks_mlx(machine) -> None:
    machine({"mlx", "llamacpp", "torch"}, apple=True)
    choice = select.choose_backend(None)
    assert (choice.name, choice.device) == ("mlx", "metal")
    assert choice.notice.startswith("backend: mlx (Apple Silicon")


def test_apple_silicon_without_mlx_runner_falls_back_to_llamacpp(machine) -> None:
    machine({"mlx", "llamacpp"}, apple=True, mlx_runner=False)
    assert select.choose_backend(None).name == "llamacpp"


def test_nvidia_picks_torch_on_cuda(machine) -> None:
    machine({"llamacpp", "torch"}, nvidia=True)
    choice = select.choose_backend(None)
    assert (choice.name, choice.device) == ("torch", "cuda")


def test_nvidia_without_torch_uses_llamacpp_and_says_how_to_use_the_gpu(machine) -> None:
    machine({"llamacpp"}, nvidia=True)
    choice = select.choose_backend(None)
    assert (choice.name, choice.device) == ("llamacpp", "cpu")
    assert "GGML_CUDA=on" in choice.reason  # the CPU wheel: the rebuild that offloads
    machine({"llamacpp"}, nvidia=True, offloads=True)
    choice = select.choose_backend(None, "gguf", "Q4_K_M", "qwen3")
    assert (choice.name, choice.device) == ("llamacpp", "cuda")
    machine(set(), nvidia=True)
    assert "pip install 'localinfer[llamacpp]'" in str(
        pytest.raises(BackendUnavailableError, select.choose_backend, None).value
    )


def test_a_gguf_goes_to_llamacpp_on_the_gpu_when_its_build_offloads(machine) -> None:
    machine({"mlx", "llamacpp", "torch"}, apple=True, offloads=True)
    choice = select.choose_backend(None, "gguf", "Q4_K_M", "gemma3")
    assert (choice.name, choice.device) == ("llamacpp", "metal")
    assert (
        choice.notice == "backend: llamacpp (Apple Silicon: llama.cpp with every layer on the GPU)"
    )
    choice = select.choose_backend(None, "safetensors", "bf16", "qwen3")
    assert (choice.name, choice.device) == ("mlx", "metal")


def test_cpu_prefers_llamacpp_then_torch(machine) -> None:
    machine({"llamacpp", "torch"})
    assert select.choose_backend(None).name == "llamacpp"
    machine({"torch"})
    choice = select.choose_backend(None)
    assert (choice.name, choice.device) == ("torch", "cpu")
    assert "pip install 'localinfer[llamacpp]'" in choice.reason


def test_safetensors_model_never_defaults_to_llamacpp(machine) -> None:
    machine({"llamacpp", "torch"})
    choice = select.choose_backend(None, model_format="safetensors")
    assert choice.name == "torch" and "GGUF only" in choice.reason
    with pytest.raises(UnsupportedModelError, match="GGUF files only"):
        select.choose_backend("llamacpp", model_format="safetensors")


def test_requested_backend_overrides_the_default(machine) -> None:
    machine({"llamacpp", "torch"}, nvidia=True)
    choice = select.choose_backend("llamacpp")
    assert (choice.name, choice.reason) == ("llamacpp", "requested with --backend")
    assert select.choose_backend("TORCH").device == "cuda"


@pytest.mark.parametrize(
    ("backend", "hint"),
    [
        ("llamacpp", "pip install 'localinfer[llamacpp]'"),
        ("torch", "pip install 'localinfer[torch]'"),
        ("mlx", "pip install 'localinfer[mlx]'"),
    ],
)
def test_requested_backend_not_installed_names_the_install_command(
    machine, backend: str, hint: str
) -> None:
    machine(set())
    with pytest.raises(BackendUnavailableError, match=hint.replace("[", r"\[")):
        select.choose_backend(backend)


def test_unknown_or_unbuilt_backend(machine) -> None:
    machine({"mlx", "torch", "llamacpp"}, mlx_runner=False)
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tpu'"):
        select.choose_backend("tpu")
    with pytest.raises(BackendUnavailableError, match="mlx backend is not part"):
        select.choose_backend("mlx")


def test_nothing_installed_lists_every_install_command(machine) -> None:
    machine(set())
    with pytest.raises(BackendUnavailableError) as err:
        select.choose_backend(None)
    for extra in ("torch", "llamacpp", "mlx"):
        assert f"localinfer[{extra}]" in str(err.value)


@pytest.fixture
def native_cpu(monkeypatch: pytest.MonkeyPatch):
    """Pretend the kernels build at ISA level ``isa`` (512 AVX-512, 256 AVX2, 0 baseline) with a
    C compiler, and their calibration found a product on blocks faster than on float32 (or
    not)."""
    from localinfer.backends.torch import native_build, native_plan, profile

    def configure(isa: int = 512, compiler: bool = True, blocks_faster: bool = True) -> None:
        one = native_plan.ProductTimes(
            tokens=1, native_f32=2.0, native_q4_1=1.0 if blocks_faster else 3.0, torch_f32=2.0
        )
        measured = native_plan.Calibration(
            isa=isa,
            threads=2,
            torch_overhead=0.0,
            products=(one,),
        )

        def plan() -> native_plan.Calibration | None:
            return measured if native_build.native_kernels_expected() else None

        monkeypatch.setattr(profile, "native_plan", plan)

        def find() -> str:
            if not compiler:
                raise native_build.BuildError("no C compiler found")
            return "cc"

        monkeypatch.setattr(native_build, "compiler", find)
        monkeypatch.delenv(native_build.DISABLE_ENV, raising=False)

    return configure


def test_cpu_picks_the_native_kernels_for_gguf_blocks_they_read_as_stored(
    machine, native_cpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine({"llamacpp", "torch"})
    native_cpu()
    for quant in ("Q4_1", "Q4_0", "Q8_0"):
        choice = select.choose_backend(None, "gguf", quant, "llama")
        assert (choice.name, choice.device) == ("torch", "cpu")
        assert f"native kernels on the file's {quant} blocks" in choice.reason
    # Types the kernels would dequantize to float32, architectures the torch runner lacks,
    # safetensors, and an explicit --backend: as before.
    assert select.choose_backend(None, "gguf", "Q4_K_M", "llama").name == "llamacpp"
    assert select.choose_backend(None, "gguf", "F16", "qwen2").name == "llamacpp"
    assert select.choose_backend(None, "gguf", "Q4_1", "gemma3").name == "llamacpp"
    assert select.choose_backend("llamacpp", "gguf", "Q4_1", "llama").name == "llamacpp"
    assert select.choose_backend(None, "gguf").name == "llamacpp"  # type unknown
    monkeypatch.setenv("LOCALINFER_NATIVE_KERNELS", "0")
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == "llamacpp"


def test_native_kernels_are_not_preferred_where_they_were_not_measured(machine, native_cpu) -> None:
    machine({"llamacpp", "torch"})
    native_cpu(isa=256)  # AVX2 + FMA: measured faster than llama.cpp too
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == "torch"
    native_cpu(isa=0)  # baseline vectors: not measured against llama.cpp
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == "llamacpp"
    native_cpu(compiler=False)
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == "llamacpp"
    native_cpu(blocks_faster=False)  # calibrated slower than torch ops on this machine
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == "llamacpp"
    machine({"llamacpp"})  # no torch
    native_cpu()
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == "llamacpp"


@pytest.mark.parametrize(
    ("winner", "isa", "backend"),
    [("native", 512, "torch"), ("native", 256, "torch"), ("native", 0, "llamacpp"),
     ("torch", 512, "llamacpp")],
)  # fmt: skip
def test_a_given_plan_chooses_as_a_measured_plan_would(
    machine, monkeypatch: pytest.MonkeyPatch, winner: str, isa: int, backend: str
) -> None:
    """LOCALINFER_NATIVE_PLAN (the suite pins "native") gives the timings only: the kernels'
    ISA stays the build's, so a default-backend test runs the path a machine whose kernels
    measured faster runs, not llama.cpp."""
    from localinfer.backends.torch import native_build, native_plan

    machine({"llamacpp", "torch"})
    monkeypatch.setenv(native_plan.PLAN_ENV, winner)
    monkeypatch.setattr(native_build, "compiler", lambda: "cc")
    monkeypatch.delenv(native_build.DISABLE_ENV, raising=False)
    monkeypatch.setattr(native_plan, "kernel_isa", lambda where, flags: isa)
    assert native_plan.native_plan().isa == isa
    assert select.choose_backend(None, "gguf", "Q4_1", "llama").name == backend


def test_the_kernel_isa_follows_the_build_flags() -> None:
    from localinfer.backends.torch.native_build import Platform, kernel_isa

    avx512 = frozenset({"avx2", "fma", "avx512f"})
    assert kernel_isa(Platform("Linux", "x86_64", "native"), avx512) == 512
    assert kernel_isa(Platform("Linux", "x86_64", "avx2"), avx512) == 256
    assert kernel_isa(Platform("Linux", "x86_64", "generic"), avx512) == 0
    assert kernel_isa(Platform("Linux", "x86_64", "native"), frozenset({"avx2", "fma"})) == 256
    assert kernel_isa(Platform("Linux", "x86_64", "native"), frozenset({"avx2"})) == 0
    assert kernel_isa(Platform("Linux", "aarch64", "native"), frozenset({"asimd"})) == 0


def test_native_block_types_are_the_ones_the_kernels_read() -> None:
    from localinfer.backends.torch.block_weights import BLOCK_FORMATS
    from localinfer.backends.torch.profile import NATIVE_BLOCK_TYPES

    assert sorted(NATIVE_BLOCK_TYPES) == sorted(BLOCK_FORMATS)


def test_selection_imports_no_framework() -> None:
    code = (
        "import sys; from localinfer.backends import select; "
        "select.is_installed('llamacpp'); select.is_apple_silicon(); "
        "select.choose_backend(None, 'gguf', 'Q4_1', 'llama'); "
        "print(sorted(m for m in ('torch', 'llama_cpp', 'mlx') if sys.modules.get(m)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.llamacpp
def test_create_runner_on_this_machine_builds_a_real_runner() -> None:
    pytest.importorskip("llama_cpp")
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    model = load_model(embedded_model_path())
    config = RunnerConfig(slots=1, max_ctx=32, threads=1)
    choice = select.choose_backend(None, "gguf", model.file_quant, model.config.arch)
    runner = select.create_runner(model, config, choice)
    try:
        assert isinstance(runner, Runner) and runner.info.backend == choice.name
    finally:
        runner.close()
    runner = select.create_runner(model, config, select.choose_backend("llamacpp", "gguf"))
    assert runner.info.backend == "llamacpp"
    runner.close()


def test_profiles_import_no_framework_and_match_their_backend() -> None:
    code = (
        "import sys; from localinfer.backends import select; "
        "names = [select.backend_profile(n).name for n in select.BACKENDS]; "
        "print(names, sorted(m for m in ('torch', 'llama_cpp', 'mlx') if sys.modules.get(m)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['torch', 'llamacpp', 'mlx'] []"


def test_planned_backend_follows_the_device_kind(machine) -> None:
    machine({"llamacpp", "torch"})
    assert select.planned_backend("cuda") == "llamacpp"  # a model file not named yet: a GGUF
    assert select.planned_backend("cuda", None, "safetensors") == "torch"
    assert select.planned_backend("metal", None, "safetensors") == "mlx"
    assert select.planned_backend("planned") == "llamacpp"
    assert select.planned_backend("cpu", None, "safetensors") == "torch"
    assert select.planned_backend("cpu", None, "gguf", "Q4_K_M", "llama") == "llamacpp"
    assert select.planned_backend("planned", "TORCH") == "torch"
    machine(set())  # the budget plans for a backend not installed here
    assert select.planned_backend("cpu") == "torch"
    with pytest.raises(BackendUnavailableError):
        select.planned_backend("cpu", "tpu")


def test_no_nvidia_driver_means_no_gpu_without_importing_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(select.shutil, "which", lambda name: None)
    monkeypatch.setattr(select.os.path, "exists", lambda path: False)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would now raise
    assert select.has_nvidia_gpu() is False
