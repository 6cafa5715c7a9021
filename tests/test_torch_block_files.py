"""The torch runner holds a Q8_0 / Q4_0 GGUF (not a K-quant file) converted from its blocks
wherever its native CPU kernels do not keep them (CUDA; a CPU in bf16, or where the kernels lost
to torch ops): Q4_0 as int4 groups of 32, Q8_0 and the Q6_K head as int8 per row, by the rules a
K-quant file is held by (backends/torch/kquant_rules.holds_converted). The plan for a simulated
CUDA device converts; the packed CPU kernels give logits close to the dequantized weights; the
budget counts what the runner holds; a float name asked gives the float copy.

Files: a tiny random llama (hidden 256, untied, llama's Q/K rows permuted in the file) written
as F32, then quantized by llama.cpp to Q8_0 and Q4_0 (whose LM head llama.cpp keeps at Q6_K),
in about a second each; nothing is downloaded. The ``gpu`` test runs the same on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp")

from localinfer.backend_budget import compute_budget  # noqa: E402
from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.torch import profile as torch_profile  # noqa: E402
from localinfer.backends.torch import weight_plan  # noqa: E402
from localinfer.backends.torch.kquant_rules import held_bytes, holds_converted  # noqa: E402
from localinfer.backends.torch.profile import PROFILE  # noqa: E402
from localinfer.backends.torch.quant_int4pack import Int4PackLinear  # noqa: E402
from localinfer.backends.torch.quant_int8pack import Int8PackLinear  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from localinfer.budget import BudgetRequest  # noqa: E402
from localinfer.budget.file_headers import read_gguf_header  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from localinfer.quality.metrics import log_softmax  # noqa: E402
from tests.model_files import TINY_VOCAB_SIZE, tiny_quantizable_llama  # noqa: E402
from tests.tiny import random_tokens  # noqa: E402

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("session_cache", "one_torch_thread")]

# The file's own type -> the form each of its stored matrix types is held in when converted.
FORMS = {
    "Q8_0": {"Q8_0": "int8"},
    "Q4_0": {"Q4_0": "int4-g32", "Q6_K": "int8"},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from localinfer.backends.llamacpp.quantize import quantize_gguf

    folder = tmp_path_factory.mktemp("torch-block-files")
    f32 = tiny_quantizable_llama(folder)
    out = {}
    for quant in FORMS:  # `localinfer quantize --to q8_0 / q4_0`
        path = folder / f"tiny-{quant.lower()}.gguf"
        quantize_gguf(f32, path, quant.lower(), threads=1, allow_requantize=True)
        out[quant] = path
    return out


def _stored(path: Path) -> dict[str, int]:
    """The file's matrix types and their stored bytes, as the budget reads them."""
    stored: dict[str, int] = {}
    for t in read_gguf_header(path).tensors:
        if len(t.shape) == 2:
            stored[t.type_name] = stored.get(t.type_name, 0) + t.nbytes
    return stored


def _logits(runner: TorchRunner, tokens: list[int]) -> np.ndarray:
    out = runner.forward([SlotWork(0, tuple(tokens), 0, "all")])[0]
    runner.close()
    return out


def _kl_top1(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """Mean KL(ref || got) per position and the share of positions whose argmax agrees."""
    lr, lg = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    return float(kl.mean()), float((ref.argmax(-1) == got.argmax(-1)).mean())


def _plan(path: Path, device: str, dtype: str, quant: str | None = None) -> weight_plan.WeightPlan:
    """The runner's weight plan for ``device``, which need not be this machine's: building
    the plan touches no device."""
    model = load_model(path)
    config = RunnerConfig(max_ctx=16, dtype=dtype, device=device, quant=quant)
    recipe = weight_plan.requantization(model, config)
    return weight_plan.plan_weights(model, config, recipe, torch.device(device), None, None)


# -- the rule ---------------------------------------------------------------------------------


def test_which_files_are_converted() -> None:
    for blocks_kept in (True, False):  # a K-quant file always
        assert holds_converted([("Q4_K", 10), ("Q6_K", 5), ("Q8_0", 50)], blocks_kept)
    for own in (("Q8_0", 100), ("Q4_0", 100), ("Q4_1", 100)):
        assert holds_converted([own, ("Q6_K", 20)], blocks_kept=False)
        assert not holds_converted([own, ("Q6_K", 20)], blocks_kept=True)
    # Other files stay dequantized: no block type the kernels keep is theirs.
    assert not holds_converted([("Q5_0", 100), ("Q6_K", 20)], blocks_kept=False)
    assert not holds_converted([("BF16", 100)], blocks_kept=False)
    assert not holds_converted([], blocks_kept=False)


@pytest.mark.parametrize("quant", list(FORMS))
def test_the_plan_for_a_cuda_device_converts(files: dict[str, Path], quant: str) -> None:
    path = files[quant]
    assert _stored(path).keys() == FORMS[quant].keys()
    plan = _plan(path, "cuda", "bfloat16")
    assert plan.kquant and plan.quant is None and plan.kernels is None and not plan.keep_blocks
    # A float name asked: the whole model in the compute dtype, as before.
    plan = _plan(path, "cuda", "bfloat16", quant="bf16")
    assert not plan.kquant and plan.quant is None
    # The budget's plan for such a machine names the same forms.
    forms = PROFILE.weight_forms(_stored(path), "cuda", "bfloat16")
    assert forms == FORMS[quant]
    request = BudgetRequest(str(path), ctx=64, backend="torch", device="cuda:16GiB")
    report = compute_budget(request)
    assert report.weight_forms == FORMS[quant]
    assert report.weights_bytes == held_bytes(read_gguf_header(path).tensors, 2, "cuda")


@pytest.mark.parametrize("kept", [True, False])
def test_a_float32_cpu_converts_only_where_the_kernels_do_not_keep_blocks(
    files: dict[str, Path], kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weight_plan, "keeps_blocks", lambda: kept)
    monkeypatch.setattr(torch_profile, "keeps_blocks", lambda: kept)
    monkeypatch.setattr(weight_plan, "load_kernels", lambda: None)  # the plan only
    path = files["Q4_0"]
    plan = _plan(path, "cpu", "float32")
    assert plan.kquant is not kept and plan.keep_blocks is kept
    forms = PROFILE.weight_forms(_stored(path), "cpu", "float32")
    assert forms == ({"Q4_0": "Q4_0", "Q6_K": "f32"} if kept else FORMS["Q4_0"])


# -- the runner on this CPU -------------------------------------------------------------------


@pytest.mark.parametrize("quant", list(FORMS))
def test_the_packed_cpu_kernels_run_close_to_the_float_weights(
    files: dict[str, Path], quant: str
) -> None:
    """bf16 on a CPU: the native kernels keep no blocks there, so the file is converted and
    multiplied by the CPU counterparts of CUDA's packed kernels."""
    model = load_model(files[quant])
    packed = TorchRunner(model, RunnerConfig(max_ctx=64, dtype="bfloat16"))
    assert packed.info.quant == quant and packed.native_max_tokens == 0
    weights = packed._model.weights  # noqa: SLF001
    layer = Int4PackLinear if quant == "Q4_0" else Int8PackLinear
    assert isinstance(weights.layers[0].qkv, layer) and isinstance(weights.layers[0].down, layer)
    assert isinstance(weights.lm_head, Int8PackLinear)  # Q8_0 or Q6_K: int8, packed
    tokens = random_tokens(40, TINY_VOCAB_SIZE)
    got = _logits(packed, tokens)
    dense = TorchRunner(model, RunnerConfig(max_ctx=64, quant="none"))  # dequantized float32
    assert dense.info.quant == "fp32" and not dense.quant_kernels
    kl, top1 = _kl_top1(_logits(dense, tokens), got)
    # Measured over these 40 tokens: Q8_0 KL 2.8e-4, top-1 90% (one int8 scale a row where
    # Q8_0 has one per 32 weights; the same weights in bf16: 4.8e-5, 100%); Q4_0 (its codes
    # exact, a Q6_K head as int8) KL 7.1e-5, top-1 97.5%. A random tiny model's logits are
    # nearly flat, so top-1 is the looser bound.
    assert kl < 1e-3 and top1 >= 0.8, (kl, top1)


@pytest.mark.parametrize("quant", list(FORMS))
def test_the_budget_counts_what_the_runner_holds(files: dict[str, Path], quant: str) -> None:
    path = files[quant]
    header = read_gguf_header(path)
    held = PROFILE.held_gguf_weights(header.tensors, header.arch, "bfloat16", "cpu")
    assert held is not None and held.source.startswith("torch: ")
    request = BudgetRequest(str(path), ctx=64, backend="torch", device="cpu", dtype="bfloat16")
    report = compute_budget(request)
    assert report.weight_forms == FORMS[quant]
    runner = TorchRunner(load_model(path), RunnerConfig(max_ctx=64, dtype="bfloat16"))
    measured = runner.memory().weights
    runner.close()
    assert measured == held.bytes == report.weights_bytes


def test_a_float_name_asked_holds_the_float_copy(files: dict[str, Path]) -> None:
    path = files["Q4_0"]
    runner = TorchRunner(load_model(path), RunnerConfig(max_ctx=16, dtype="bfloat16", quant="bf16"))
    assert runner.info.quant == "bf16" and not runner.quant_kernels
    runner.close()
    request = BudgetRequest(
        str(path), ctx=16, backend="torch", device="cuda:16GiB", dtype="bfloat16", quant="bf16"
    )
    assert compute_budget(request).weight_forms == {}  # not the file's own: the float rules


# -- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", list(FORMS))
def test_cuda_runs_the_packed_kernels_close_to_the_float_weights(
    files: dict[str, Path], quant: str
) -> None:
    path = files[quant]
    model = load_model(path)
    runner = TorchRunner(model, RunnerConfig(max_ctx=64, device="cuda"))  # bf16 by default
    assert runner.info.quant == quant
    # Every layer and the head on a packed kernel; only a Q4_0 table dequantizes (its rows).
    want = {"Q8_0": {"int8pack"}, "Q4_0": {"int4pack", "int8pack", "dequant"}}[quant]
    assert set(runner.quant_kernels) == want, runner.quant_kernels
    assert runner.memory().weights == held_bytes(read_gguf_header(path).tensors, 2, "cuda")
    tokens = random_tokens(40, TINY_VOCAB_SIZE)
    got = _logits(runner, tokens)
    dense = TorchRunner(model, RunnerConfig(max_ctx=64, quant="none"))  # float32, on the CPU
    kl, top1 = _kl_top1(_logits(dense, tokens), got)
    # bf16 throughout on CUDA, not only in the products: looser than the CPU test's bound.
    assert kl < 5e-3 and top1 >= 0.85, (kl, top1)
