"""The MLX runner keeps a GGUF's block matrices quantized (backends/mlx/gguf_forms.py): every type
converted from its stored bytes to MLX's affine groups of 32 gives back gguf-py's dequantization
(exactly for the types whose blocks are groups of 32, within half a step of the new grid for the
requantized ones), a Q4_K_M file runs close to its float weights while holding about its file's
bytes, and the budget counts exactly what the runner holds.

Files: tiny random models (hidden 256, so every matrix takes the K-quant the recipe names) written
by gguf-py (Q4_0 .. Q8_0) or quantized by llama.cpp (Q2_K, Q3_K_M, Q5_K_M), and the embedded
SmolLM2-135M requantized to Q4_K_M (its 576-wide matrices fall back to Q5_0/Q8_0, ffn_down is
Q4_K/Q6_K). Each is built once per module, in about a second; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("llama_cpp")

from localinfer.backends.mlx.gguf_blocks import convert  # noqa: E402
from localinfer.backends.mlx.gguf_forms import GGUF_FORMS, held_form, is_exact  # noqa: E402
from localinfer.backends.mlx.native import dequantized, gguf_matrix  # noqa: E402
from localinfer.backends.mlx.profile import PROFILE  # noqa: E402
from localinfer.facts.arch import ArchSpec  # noqa: E402
from localinfer.loading.embedded import embedded_model_path  # noqa: E402
from localinfer.loading.gguf_file import GGUFFile  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from tests.mlx_helpers import feed, make_runner  # noqa: E402
from tests.model_files import TINY_VOCAB_SIZE, write_gguf  # noqa: E402
from tests.tiny import random_tokens, tiny_config, tiny_weights  # noqa: E402

pytestmark = [pytest.mark.mlx, pytest.mark.llamacpp, pytest.mark.usefixtures("session_cache")]

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf-py writes these
LLAMA_CPP_RECIPES = ("q2_k", "q3_k_m", "q5_k_m")  # with Q4_K_M, every K-quant type
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
    folder = tmp_path_factory.mktemp("kquant")
    config = tiny_config(
        "llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, ffn_size=512, head_dim=64,
        n_heads=4, n_kv_heads=2, tied_embeddings=False,
    )  # fmt: skip
    weights = tiny_weights(config)
    tensors = {n: weights.get(n) for n in weights.names()}
    out = {"f32": write_gguf(folder / "tiny-f32.gguf", config, tensors)}
    for t in LEGACY:
        qtype = gguf.GGMLQuantizationType[t]
        out[t] = write_gguf(folder / f"tiny-{t}.gguf", config, tensors, qtype=qtype)
    for recipe in LLAMA_CPP_RECIPES:
        out[recipe] = _quantize(out["f32"], folder / f"tiny-{recipe}.gguf", recipe)
    out["smollm2"] = _quantize(embedded_model_path(), folder / "smollm2-q4_k_m.gguf", "q4_k_m")
    return out


def _tensors_of(files: dict[str, Path], type_name: str) -> list[tuple[GGUFFile, str]]:
    """Up to three 2-D tensors stored as ``type_name``, from the tiny files and SmolLM2."""
    found = []
    for path in files.values():
        g = GGUFFile(path)
        found += [(g, n) for n, t in g.tensors.items() if t.type_name == type_name]
    assert found, f"no {type_name} tensor in the test files"
    return found[:2] + found[-1:]


# -- each type, converted and dequantized back ---------------------------------------------------


@pytest.mark.parametrize("type_name", sorted(GGUF_FORMS))
def test_converted_matrices_dequantize_to_gguf_values(files, type_name):
    bits = GGUF_FORMS[type_name][0].bits
    levels = (1 << bits) - 1
    for g, name in _tensors_of(files, type_name):
        rows, cols = g.tensors[name].shape
        raw = g.raw(name)
        ref = g.dequantize(name)  # gguf-py's reading of the stored bytes, float32
        assert held_form(type_name, (rows, cols)) is not None
        packed, scales, biases = convert(type_name, raw, cols, bits)
        # Float32 scales: the codes and the block arithmetic alone.
        exact = np.array(
            mx.dequantize(
                mx.array(packed), mx.array(scales), mx.array(biases), group_size=32, bits=bits
            )
        )
        groups = ref.reshape(rows, cols // 32, 32)
        if is_exact(type_name):
            # The stored codes and block scales: gguf-py's values up to float32 rounding.
            tol = 1e-6 * np.abs(ref).max()
            np.testing.assert_allclose(exact, ref, rtol=0, atol=tol, err_msg=name)
            # Held with float16 scale and bias: each off by at most half a float16 step.
            bound = (np.abs(scales) * levels + np.abs(biases)) * 2.0**-11
        else:
            # Requantized (scales already float16): within half a step of the group's new grid
            # (min/max over its values), plus the float16 rounding of that grid's scale and
            # minimum (under a 2**-11 relative step each, over ``levels`` steps).
            step = (groups.max(-1) - groups.min(-1)) / levels
            bound = 0.5 * step + np.abs(groups).max(-1) * 2.0**-9
            err = np.abs(exact - ref).reshape(groups.shape).max(-1)
            assert (err <= bound + 1e-7).all(), (name, (err / bound).max())
        # What the runner holds: float16 scales and biases, packed as MLX's kernels read them.
        m = gguf_matrix(type_name, raw, cols, bits, mx.float16)
        held = np.array(dequantized(m, mx.float32)).reshape(groups.shape)
        assert (np.abs(held - groups).max(-1) <= bound + 1e-7).all(), name


def test_q6_k_requantized_to_8_bits_keeps_its_own_step(files):
    """Q6_K's sub-blocks of 16 (int8 scale each) share one 8-bit grid in MLX: the added error is
    a small part of Q6_K's own step, d * |scale| (max over the two sub-blocks)."""
    for g, name in _tensors_of(files, "Q6_K"):
        rows, cols = g.tensors[name].shape
        raw = g.raw(name)
        m = gguf_matrix("Q6_K", raw, cols, 8, mx.float16)
        err = np.abs(np.array(dequantized(m, mx.float32)) - g.dequantize(name))
        blocks = raw.reshape(rows, cols // 256, 210)
        d = blocks[..., 208:210].copy().view(np.float16).astype(np.float32)  # [rows, nb, 1]
        sc = np.abs(blocks[..., 192:208].view(np.int8).astype(np.float32))  # [rows, nb, 16]
        own_step = np.abs(d * sc).reshape(rows, cols // 32, 2).max(-1)  # per group of 32
        ratio = err.reshape(rows, cols // 32, 32).max(-1) / np.maximum(own_step, 1e-12)
        assert ratio.max() < 0.15, (name, ratio.max())  # 63 / 255 / 2 = 0.124 + rounding


# -- the runner on a file ----------------------------------------------------------------------


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_q4_k_m_runs_quantized_close_to_its_float_weights(files):
    model = load_model(files["smollm2"])
    # The prompt's first 16 tokens: mlx[cpu] has no BLAS (about 0.15 s a token for each of the
    # two runners), and the logits of a causal model's first positions are those of the whole
    # prompt's (measured there: top-1 equal at all 43 positions and at these 16, KL mean 6e-4
    # over all, 8e-4 over the first 24, 1.1e-3 over these 16, max 4.1e-3 in all three).
    tokens = model.tokenizer.encode(PROMPT)[:16]
    runner = make_runner(model, slots=1, max_ctx=64)
    assert runner.info.quant == "Q4_K_M"
    w = runner._model.weights
    types = {model.weights.quant_type(n) for n in model.weights.names()}
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} <= types
    for layer in w.layers:
        for m in [*layer.qkv.parts, layer.o, *layer.gate_up.parts, layer.down]:
            assert m.quantized and m.group_size == 32 and m.bits in (4, 5, 8)
    assert w.embed.quantized and w.lm_head is w.embed  # tied: one quantized table
    # Q5_0 q|k fused; V is Q8_0 in some layers (then its own product), Q5_0 (fused) in others.
    assert {len(layer.qkv.parts) for layer in w.layers} == {1, 2}
    assert w.nbytes() <= 1.3 * model.weights.nbytes()
    ours = feed(runner, 0, tokens)
    reference = feed(make_runner(model, quant="none", slots=1, max_ctx=64), 0, tokens)
    lp, lq = _log_softmax(reference), _log_softmax(ours)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    assert (ours.argmax(-1) == reference.argmax(-1)).mean() >= 0.95
    assert kl.mean() < 3e-3 and kl.max() < 3e-2, (kl.mean(), kl.max())


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


@pytest.mark.parametrize("recipe", LLAMA_CPP_RECIPES)
def test_tiny_k_quant_files_match_their_float_weights(files, recipe):
    """Every K-quant type in a forward (llama rows un-permuted as blocks), and mixed parts: Q2_K's
    V is Q3_K (5-bit) beside 4-bit Q and K, so q|k is one product and v another.

    A random model this small is far more sensitive than a trained one (its Q6_K file's logits
    already differ 6% from float32), so the conversion's error is measured against the file's
    own: the requantized types add about a quarter of it (RMS), i.e. ~3% in quadrature."""
    model = load_model(files[recipe])
    runner = make_runner(model, slots=1, max_ctx=64)
    assert runner.info.quant == model.file_quant
    tokens = random_tokens(40, vocab=TINY_VOCAB_SIZE)
    ours = feed(runner, 0, tokens, [30, 1, 9])
    dequantized_ = feed(make_runner(model, quant="none", slots=1, max_ctx=64), 0, tokens)
    original = feed(make_runner(load_model(files["f32"]), slots=1, max_ctx=64), 0, tokens)
    assert _rms(ours - dequantized_) < 0.35 * _rms(dequantized_ - original)
    qkv = runner._model.weights.layers[0].qkv
    if recipe == "q2_k":
        assert [(p.bits, p.out_features) for p in qkv.parts] == [(4, 256 + 128), (5, 128)]
        assert [m.out_features for m in qkv.matrices()] == [256, 128, 128]


# -- the budget counts what the runner holds ---------------------------------------------------


@pytest.mark.parametrize("key", ["smollm2", *LLAMA_CPP_RECIPES])
def test_budget_weights_are_the_runners(files, key):
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest

    path = files[key]
    report = compute_budget(BudgetRequest(str(path), backend="mlx", device="cpu", ctx=64))
    runner = make_runner(load_model(path), slots=1, max_ctx=64)
    # The arrays' own bytes, exactly; the allocator's count (what --verify reads) within 10%.
    assert report.weights_bytes == runner._model.weights.nbytes()
    assert abs(runner.memory().weights / report.weights_bytes - 1) < 0.1
    assert report.weights_source.startswith("MLX affine groups of 32")
    if key == "smollm2":
        assert "Q4_K 4-bit" in report.weights_source
        assert "Q6_K 8-bit (requantized)" in report.weights_source


def test_files_of_legacy_blocks_are_counted_as_held_too():
    """The embedded Q4_1 file goes through the held-weights seam as well, exactly (its Q8_0
    table is 36 bytes per 32 weights in MLX, two float16 per group, against 34 stored), with
    the head's promoted scales still in the compute buffers."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest

    report = compute_budget(BudgetRequest(str(embedded_model_path()), backend="mlx", device="cpu"))
    assert report.weights_source.startswith("MLX")
    runner = make_runner(load_model(embedded_model_path()), slots=1, max_ctx=64)
    assert report.weights_bytes == runner._model.weights.nbytes()
    assert report.compute_bytes > 6 * 2**20  # the head's float32 scales and biases


def test_promoted_head_scales_of_a_k_quant_file():
    """The LM head of a K-quant file is held in groups of 32 (Q6_K at 8 bits): its float16 scales
    and biases are promoted to float32 for each product, as a Q4_0 file's are."""
    arch = ArchSpec(
        arch="llama", n_layers=30, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64,
        ffn_size=1536, vocab_size=49152, max_ctx=8192, tied_embeddings=True,
    )  # fmt: skip
    expected = 2 * arch.vocab_size * (arch.hidden_size // 32) * 4
    assert PROFILE.promoted_weight_bytes(arch, "Q4_K_M", "float32") == expected
    assert PROFILE.promoted_weight_bytes(arch, "Q4_0", "float32") == expected
    assert PROFILE.promoted_weight_bytes(arch, "F16", "float32") == 0
    assert PROFILE.promoted_weight_bytes(arch, "Q4_K_M", "bfloat16") == 0
