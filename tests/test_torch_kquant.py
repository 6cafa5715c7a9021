"""The torch runner holds a K-quant GGUF quantized (backends/torch/kquant_*.py): Q4_K / Q4_0 /
Q4_1 converted to int4 groups of 32 give back gguf-py's dequantization exactly, the other types
as int8 per row within half a row step of it; a Q4_K_M file runs through the packed kernels
close to its float weights while holding about its file's bytes, and the budget counts exactly
what the runner holds.

Files: a tiny random llama (hidden 256, untied, so its matrices take the K-quants the recipe
names; llama's Q/K rows are permuted in the file) and the embedded SmolLM2-135M, requantized by
llama.cpp (its 576-wide matrices fall back to Q5_0 / Q8_0, ffn_down is Q4_K / Q6_K). Each is
built once per module in about a second; nothing is downloaded.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("llama_cpp")

from localinfer.backend_budget import compute_budget  # noqa: E402
from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.torch.kquant_convert import int4_matrix, int8_matrix  # noqa: E402
from localinfer.backends.torch.kquant_form import kquant_form  # noqa: E402
from localinfer.backends.torch.kquant_linear import SplitLinear  # noqa: E402
from localinfer.backends.torch.kquant_rules import held_bytes, is_kquant_file  # noqa: E402
from localinfer.backends.torch.profile import PROFILE  # noqa: E402
from localinfer.backends.torch.quant_int4pack import Int4PackLinear  # noqa: E402
from localinfer.backends.torch.quant_int8pack import Int8PackLinear  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from localinfer.backends.torch.weight_loading import load_weights  # noqa: E402
from localinfer.budget import BudgetRequest  # noqa: E402
from localinfer.budget.file_headers import read_gguf_header  # noqa: E402
from localinfer.loading.embedded import embedded_model_path  # noqa: E402
from localinfer.loading.gguf_file import GGUFFile  # noqa: E402
from localinfer.loading.gguf_weights import GGUFWeights  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from localinfer.quality.metrics import log_softmax  # noqa: E402
from tests.model_files import TINY_VOCAB_SIZE, tiny_quantizable_llama, write_gguf  # noqa: E402
from tests.tiny import random_tokens, tiny_config, tiny_weights  # noqa: E402

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("session_cache", "one_torch_thread")]

LLAMA_CPP_RECIPES = ("q4_k_m", "q5_k_m", "q2_k")  # every K-quant type between them
PROMPT = (
    "The quick brown fox jumps over the lazy dog. In 1905, Albert Einstein published four "
    "papers that changed physics: the photoelectric effect, Brownian motion, special relativity "
    "and mass-energy equivalence."
)


def _quantize(source: Path, out: Path, recipe: str) -> Path:
    """``source`` requantized by llama.cpp (the `localinfer quantize` code path; its target table
    names only the recipes the command offers, so the others are added for the call)."""
    from localinfer.backends.llamacpp import quantize as llamacpp_quantize

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(
            llamacpp_quantize.TARGETS, recipe, (f"LLAMA_FTYPE_MOSTLY_{recipe.upper()}", recipe)
        )
        llamacpp_quantize.quantize_gguf(source, out, recipe, threads=1, allow_requantize=True)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("torch-kquant")
    f32 = tiny_quantizable_llama(folder)
    out = {r: _quantize(f32, folder / f"tiny-{r}.gguf", r) for r in LLAMA_CPP_RECIPES}
    out["smollm2"] = _quantize(embedded_model_path(), folder / "smollm2-q4_k_m.gguf", "q4_k_m")
    return out


def _stored(files: dict[str, Path], type_name: str, most: int = 3) -> list[tuple[GGUFFile, str]]:
    """Up to ``most`` matrices stored as ``type_name`` in each file."""
    found = []
    for path in files.values():
        g = GGUFFile(path)
        names = [n for n, t in g.tensors.items() if t.type_name == type_name and len(t.shape) == 2]
        found += [(g, n) for n in names[:most]]
    return found


def _kl_top1(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """Mean KL(ref || got) per position and the share of positions whose argmax agrees."""
    lr, lg = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    return float(kl.mean()), float((ref.argmax(-1) == got.argmax(-1)).mean())


# -- conversion -----------------------------------------------------------------------------------


@pytest.mark.parametrize("type_name", ["Q4_K", "Q4_0", "Q4_1"])
def test_int4_conversion_gives_the_stored_values_exactly(
    files: dict[str, Path], type_name: str
) -> None:
    if type_name == "Q4_K":
        matrices = [(g.raw(n), g.dequantize(n)) for g, n in _stored(files, "Q4_K")]
        assert len(matrices) >= 4  # the tiny files' and SmolLM2's ffn_down
    else:  # llama.cpp writes these only as fallbacks: gguf-py's blocks of a random matrix
        qtype = gguf.GGMLQuantizationType[type_name]
        w = np.random.default_rng(0).normal(size=(48, 256)).astype(np.float32)
        blocks = gguf.quants.quantize(w, qtype)
        matrices = [(blocks, gguf.quants.dequantize(blocks, qtype))]
    for raw, want in matrices:
        got = int4_matrix(type_name, raw, want.shape[1]).dequantize(torch.float32).numpy()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("type_name", ["Q5_0", "Q8_0", "Q5_K", "Q6_K", "Q3_K", "Q2_K"])
def test_int8_conversion_is_within_half_a_row_step(files: dict[str, Path], type_name: str) -> None:
    stored = _stored(files, type_name)
    assert stored, f"no {type_name} matrix in the test files"
    for g, name in stored:
        want = g.dequantize(name)
        m = int8_matrix(want)
        err = np.abs(m.dequantize(torch.float32).numpy() - want)
        step = m.scales.numpy()[:, None]  # the row's max / 127
        assert (err <= step * (0.5 + 1e-5)).all(), name
        # A step is 1/127 of the row's largest weight: an error of at most 0.4% of it.
        assert err.max(axis=1).max() <= np.abs(want).max(axis=1).max() / 254 * (1 + 1e-5)


def test_int4pack_multiplies_by_the_scales_rounded_once(files: dict[str, Path]) -> None:
    g, name = _stored(files, "Q4_K", most=1)[-1]  # a SmolLM2 ffn_down: 576 x 1536
    matrix = int4_matrix("Q4_K", g.raw(name), g.tensors[name].shape[1])
    packed = Int4PackLinear(matrix, torch.float32)
    scale, zero = packed.scales_zeros.float().transpose(0, 1).unbind(-1)  # [out, groups] each
    exact_scale = matrix.scales.float()
    exact_zero = matrix.minimum.float() + 8 * exact_scale
    # bf16 keeps 8 significant bits: each factor within half a unit of its 8th bit.
    assert ((scale - exact_scale).abs() <= exact_scale.abs() * 2**-8).all()
    assert ((zero - exact_zero).abs() <= exact_zero.abs() * 2**-8).all()
    q = matrix.qweight
    codes = torch.stack((q & 15, q >> 4), dim=-1).view(q.shape[0], -1, 32).float()
    held = ((codes - 8) * scale[..., None] + zero[..., None]).view(q.shape[0], -1)
    x = torch.randn(3, matrix.in_features, generator=torch.Generator().manual_seed(0))
    want = F.linear(x.bfloat16().float(), held)
    got = packed(x)
    assert ((got - want).norm() / want.norm()).item() < 1e-2


def test_which_files_are_k_quant_files() -> None:
    assert is_kquant_file([("Q4_K", 10), ("Q6_K", 5), ("Q5_0", 100), ("Q8_0", 50)])  # SmolLM2
    assert is_kquant_file([("Q6_K", 100), ("Q8_0", 20)])  # a Q6_K file
    assert not is_kquant_file([("Q4_0", 100), ("Q6_K", 20)])  # a Q4_0 file, its head at Q6_K
    assert not is_kquant_file([("Q8_0", 100)]) and not is_kquant_file([])


# -- the runner ------------------------------------------------------------------------------------


def _logits(runner: TorchRunner, tokens: list[int]) -> np.ndarray:
    out = runner.forward([SlotWork(0, tuple(tokens), 0, "all")])[0]
    runner.close()
    return out


def test_smollm2_q4_k_m_runs_packed_close_to_its_float_weights(files: dict[str, Path]) -> None:
    path = files["smollm2"]
    model = load_model(path)
    tokens = model.tokenizer.encode(PROMPT, add_special_tokens=True)
    packed = TorchRunner(model, RunnerConfig(max_ctx=128))  # no quant asked: the file's own
    assert packed.info.quant == "Q4_K_M" and packed.native_max_tokens == 0
    # Every matrix on a packed kernel (the CPU default for K-quants), none dequantizing.
    assert set(packed.quant_kernels) == {"int4pack", "int8pack"}, packed.quant_kernels
    held = packed.memory().weights
    header = read_gguf_header(path)
    assert held <= 1.3 * GGUFFile(path).tensor_nbytes()
    assert held == held_bytes(header.tensors, 4, "cpu")
    got = _logits(packed, tokens)
    dense = TorchRunner(model, RunnerConfig(max_ctx=128, quant="none"))  # dequantized float32
    assert dense.info.quant == "fp32" and not dense.quant_kernels
    kl, top1 = _kl_top1(_logits(dense, tokens), got)
    # Measured: KL 0.0058, top-1 95%; the int8 rows of Q5_0 / Q8_0 cost most of it.
    assert kl < 0.015 and top1 >= 0.85, (kl, top1)


def test_tiny_q4_k_m_runs_close_to_its_float_weights(files: dict[str, Path]) -> None:
    """Q4_K q/k rows un-permuted as stored bytes, q|k (Q4_K) beside v (Q6_K) in one layer, an
    untied Q4_K table gathered and a Q6_K head."""
    model = load_model(files["q4_k_m"])
    packed = TorchRunner(model, RunnerConfig(max_ctx=64))
    weights = packed._model.weights
    assert isinstance(weights.layers[1].qkv, SplitLinear)
    assert isinstance(weights.lm_head, Int8PackLinear) and weights.embed.kernel == "dequant"
    tokens = random_tokens(40, TINY_VOCAB_SIZE)
    got = _logits(packed, tokens)
    want = _logits(TorchRunner(model, RunnerConfig(max_ctx=64, quant="none")), tokens)
    kl, top1 = _kl_top1(want, got)
    assert kl < 1e-3 and top1 >= 0.9, (kl, top1)


@pytest.mark.parametrize("vocab", [288, TINY_VOCAB_SIZE])
def test_a_tied_int4_table_gathers_codes_and_heads_a_packed_copy(
    tmp_path: Path, vocab: int
) -> None:
    """288 rows pack for the CPU kernel (a multiple of 16): the head is a packed copy beside the
    table; the tiny vocabulary's 278 do not, and the table serves both."""
    config = tiny_config("llama", vocab_size=vocab)  # tied
    source = tiny_weights(config)
    path = write_gguf(
        tmp_path / "tied.gguf", config, {n: source.get(n) for n in source.names()},
        qtype=gguf.GGMLQuantizationType.Q4_0,
    )  # fmt: skip
    stored = GGUFWeights(GGUFFile(path), config)
    weights = load_weights(
        config, stored, kquant_form(config, stored, torch.float32, torch.device("cpu"))
    )
    table = stored.get("model.embed_tokens.weight")
    ids = torch.tensor([0, 5, vocab - 1])
    assert torch.equal(weights.embed_rows(ids), torch.from_numpy(table[ids.numpy()]))
    assert (weights.lm_head is weights.embed) == (vocab % 16 != 0)
    x = torch.randn(2, config.hidden_size, generator=torch.Generator().manual_seed(0))
    want = F.linear(x, torch.from_numpy(table))
    assert ((weights.lm_linear(x, weights.lm_head) - want).norm() / want.norm()) < 1e-2
    assert weights.nbytes() == held_bytes(read_gguf_header(path).tensors, 4, "cpu")


# -- the budget ------------------------------------------------------------------------------------


@functools.cache
def _runner_weights(path: Path, dtype: str) -> int:
    """What a CPU runner on ``path`` in ``dtype`` holds for its weights (the context does not
    change it): each file and dtype loaded once per module, not once per test that asks (the
    SmolLM2 file's conversion is most of those tests' time); an int, so nothing else is shared."""
    runner = TorchRunner(load_model(path), RunnerConfig(max_ctx=16, dtype=dtype))
    try:
        return runner.memory().weights
    finally:
        runner.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_profile_counts_what_the_runner_holds(files: dict[str, Path], dtype: str) -> None:
    for key in ("smollm2", "q4_k_m", "q5_k_m"):
        path = files[key]
        header = read_gguf_header(path)
        held = PROFILE.held_gguf_weights(header.tensors, header.arch, dtype, "cpu")
        assert held is not None and held.source.startswith("torch: ")
        assert _runner_weights(path, dtype) == held.bytes, key


def test_the_budget_counts_what_the_runner_holds(files: dict[str, Path]) -> None:
    """Through the planner, on a CPU in bf16 (in float32 it asks kept_blocks first: below)."""
    path = files["smollm2"]
    request = BudgetRequest(str(path), ctx=64, backend="torch", device="cpu", dtype="bfloat16")
    report = compute_budget(request)
    measured = _runner_weights(path, "bfloat16")
    assert abs(report.weights_bytes / measured - 1) <= 0.10
    assert "int4 groups of 32" in report.weights_source
    # A planned GPU: the same forms, int8 row scales in the compute dtype (no GPU to measure).
    request = BudgetRequest(
        str(path), ctx=64, backend="torch", device="cuda:16GiB", dtype="bfloat16"
    )
    held = held_bytes(read_gguf_header(path).tensors, 2, "cuda")
    assert compute_budget(request).weights_bytes == held


def test_the_float32_cpu_budget_counts_what_the_runner_holds(files: dict[str, Path]) -> None:
    path = files["smollm2"]
    report = compute_budget(BudgetRequest(str(path), ctx=64, backend="torch", device="cpu"))
    measured = _runner_weights(path, "float32")  # RunnerConfig's default dtype
    assert abs(report.weights_bytes / measured - 1) <= 0.10
