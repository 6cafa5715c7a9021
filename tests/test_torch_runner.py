"""TorchRunner against the independent numpy reference, plus the Runner protocol's invariants.

Every behavioural test runs on CPU and, marked ``gpu``, on CUDA (scripts/gpu-check), so the CUDA
path runs the same code and the same assertions.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localinfer.backends.base import MemoryReport, Runner, RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner, create_runner  # noqa: E402
from localinfer.errors import ContextOverflowError, UnsupportedModelError  # noqa: E402
from localinfer.loading.model import LoadedModel  # noqa: E402
from localinfer.loading.model_config import RopeScaling  # noqa: E402
from tests.reference_numpy import reference_logits  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


def make_runner(
    model: LoadedModel, device: str = "cpu", native_max_tokens: int | None = None, **kw: object
) -> TorchRunner:
    cfg = dict(slots=4, max_ctx=96, dtype="float32", device=device)
    cfg.update(kw)
    return TorchRunner(model, RunnerConfig(**cfg), native_max_tokens)  # type: ignore[arg-type]


# The two CPU fp32 paths: the native kernels for every forward, or torch ops for every forward
# (CUDA always runs torch ops). Tests run both where the path matters.
PATHS = {"native": 10**6, "torch-ops": 0}


def prefill_chunks(
    runner: TorchRunner, slot: int, tokens: list[int], chunks: list[int]
) -> np.ndarray:
    """Feed tokens through the cache in chunks (logits="all"); returns [len(tokens), vocab]."""
    out, pos = [], runner.slot_length(slot)
    for size in chunks:
        part = tuple(tokens[pos : pos + size])
        if not part:
            break
        (logits,) = runner.forward([SlotWork(slot, part, pos, logits="all")])
        out.append(logits)
        pos += len(part)
    assert pos == len(tokens)
    return np.concatenate(out)


ARCH_CASES = {
    "llama-tied": ("llama", {}),
    "llama-untied": ("llama", {"tied_embeddings": False}),
    # window 8 < 50 tokens; layer 1 keeps full attention, so both masks are exercised.
    "mistral-window": ("mistral", {"sliding_window": 8, "sliding_layers": (0,)}),
    "qwen2": ("qwen2", {}),
    "qwen3-tied": ("qwen3", {}),
    "qwen3-untied": ("qwen3", {"tied_embeddings": False}),
    "llama3-rope-scaling": (
        "llama",
        {
            "rope_scaling": RopeScaling(
                kind="llama3", factor=8.0, original_max_position_embeddings=64
            ),
            "rope_theta": 500000.0,
        },
    ),
    "gqa-4-to-1": ("llama", {"n_kv_heads": 1}),
}


@pytest.mark.parametrize("path", ["native", "torch-ops"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(ARCH_CASES))
def test_teacher_forced_logits_match_numpy_reference(case: str, device: str, path: str) -> None:
    if device != "cpu" and path == "native":
        pytest.skip("the native kernels are CPU-only")
    arch, overrides = ARCH_CASES[case]
    model = tiny_model(arch, **overrides)
    tokens = random_tokens(50)
    expected = reference_logits(model.config, model.weights, tokens)
    runner = make_runner(model, device, PATHS[path] if device == "cpu" else None)
    got = prefill_chunks(runner, 1, tokens, [17, 1, 20, 3, 9])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_dense_matmul_path_matches_reference_on_cpu(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU fp32 runs the native kernels and dense F.linear, or oneDNN-packed matrices without
    them; CUDA (and fp16 on CPU) the dense F.linear path alone. Force that here so the code CUDA
    runs is also checked on a machine without a GPU."""
    from localinfer.backends.torch import weight_plan

    monkeypatch.setattr(weight_plan, "onednn_available", lambda dtype, device: False)
    model = tiny_model(arch)
    runner = make_runner(model, native_max_tokens=0)
    assert not runner.packed_weights and runner.native_max_tokens == 0
    tokens = random_tokens(40)
    got = prefill_chunks(runner, 0, tokens, [25, 1, 14])
    want = reference_logits(model.config, model.weights, tokens)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", ["native", "torch-ops"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_ragged_batch_equals_each_slot_alone(arch: str, device: str, path: str) -> None:
    if device != "cpu" and path == "native":
        pytest.skip("the native kernels are CPU-only")
    model = tiny_model(arch, sliding_window=8) if arch == "mistral" else tiny_model(arch)
    native = {"native_max_tokens": PATHS[path]} if device == "cpu" else {}
    histories = {
        0: random_tokens(10, seed=2),
        2: random_tokens(25, seed=3),
        3: random_tokens(40, seed=4),
    }
    # Mixed in one forward: a decode, a long prefill, a 4-token verify (all logits), a short
    # prefill; given out of slot order.
    steps = [
        SlotWork(2, tuple(random_tokens(4, seed=5)), 25, logits="all"),
        SlotWork(1, tuple(random_tokens(30, seed=6)), 0, logits="all"),
        SlotWork(0, (7,), 10),
        SlotWork(3, tuple(random_tokens(5, seed=7)), 40),
    ]
    batched = make_runner(model, device, **native)
    assert batched.native_max_tokens == PATHS[path] if device == "cpu" else True
    for slot, hist in histories.items():
        batched.forward([SlotWork(slot, tuple(hist), 0)])
    results = batched.forward(steps)

    for work, got in zip(steps, results, strict=True):
        alone = make_runner(model, device, slots=1, **native)
        if work.slot in histories:
            alone.forward([SlotWork(0, tuple(histories[work.slot]), 0)])
        (want,) = alone.forward([SlotWork(0, work.tokens, work.start_pos, work.logits)])
        assert got.shape == want.shape == ((len(work.tokens) if work.logits == "all" else 1), 256)
        assert got.dtype == np.float32
        if path == "native":  # every token's sums run in the same order whatever the batch
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert batched.slot_length(work.slot) == work.start_pos + len(work.tokens)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps_across_all_slots_match_reference(device: str) -> None:
    model = tiny_model("qwen3")
    runner = make_runner(model, device)
    seqs = {s: random_tokens(3 + 5 * s, seed=10 + s) for s in range(4)}
    runner.forward([SlotWork(s, tuple(t), 0) for s, t in seqs.items()])
    for step in range(6):
        batch = [SlotWork(s, (step + s,), len(t)) for s, t in seqs.items()]
        outs = runner.forward(batch)
        for work, got in zip(batch, outs, strict=True):
            seqs[work.slot].append(work.tokens[0])
            want = reference_logits(model.config, model.weights, seqs[work.slot])[-1:]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_truncate_then_refeed_gives_same_logits(device: str) -> None:
    model = tiny_model("llama")
    tokens = random_tokens(30)
    runner = make_runner(model, device)
    first = prefill_chunks(runner, 0, tokens, [30])
    runner.truncate(0, 22)
    assert runner.slot_length(0) == 22
    (again,) = runner.forward([SlotWork(0, tuple(tokens[22:]), 22, logits="all")])
    np.testing.assert_allclose(again, first[22:], rtol=1e-5, atol=1e-5)

    # Rollback then a different continuation must not see the overwritten entries.
    runner.truncate(0, 20)
    other = tokens[:20] + random_tokens(6, seed=9)
    (branch,) = runner.forward([SlotWork(0, tuple(other[20:]), 20, logits="all")])
    want = reference_logits(model.config, model.weights, other)[20:]
    np.testing.assert_allclose(branch, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_release_forgets_the_slot(device: str) -> None:
    model = tiny_model("qwen2")
    runner = make_runner(model, device)
    runner.forward([SlotWork(2, tuple(random_tokens(12)), 0)])
    runner.release(2)
    assert runner.slot_length(2) == 0
    fresh = random_tokens(8, seed=4)
    (got,) = runner.forward([SlotWork(2, tuple(fresh), 0, logits="all")])
    np.testing.assert_allclose(
        got, reference_logits(model.config, model.weights, fresh), rtol=1e-4, atol=1e-4
    )


def test_batch_violations_raise_and_leave_state_unchanged() -> None:
    runner = make_runner(tiny_model("llama"), max_ctx=32)
    runner.forward([SlotWork(0, (1, 2, 3), 0)])
    with pytest.raises(ValueError, match="truncate first"):
        runner.forward([SlotWork(0, (4,), 5)])
    with pytest.raises(ValueError, match="twice"):
        runner.forward([SlotWork(1, (4,), 0), SlotWork(1, (5,), 0)])
    with pytest.raises(ValueError, match="out of range"):
        runner.forward([SlotWork(4, (4,), 0)])
    with pytest.raises(ValueError, match="token id"):
        runner.forward([SlotWork(1, (256,), 0)])
    with pytest.raises(ContextOverflowError):
        runner.forward([SlotWork(1, (4,), 0), SlotWork(0, tuple(range(30)), 3)])
    with pytest.raises(ValueError):
        runner.truncate(0, 4)  # longer than what is cached
    assert [runner.slot_length(s) for s in range(4)] == [3, 0, 0, 0]
    assert runner.forward([]) == []
    # The context fills exactly to max_ctx.
    runner.forward([SlotWork(0, tuple(range(29)), 3)])
    assert runner.slot_length(0) == 32
    with pytest.raises(ContextOverflowError):
        runner.forward([SlotWork(0, (1,), 32)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_agrees_with_fp32_on_top1(dtype: str, device: str) -> None:
    model = tiny_model("qwen3", tied_embeddings=False)
    tokens = random_tokens(60)
    ref = prefill_chunks(make_runner(model, device), 0, tokens, [40, 20])
    low = make_runner(model, device, dtype=dtype)
    got = prefill_chunks(low, 0, tokens, [40, 20])
    assert got.dtype == np.float32 and np.isfinite(got).all()
    agree = np.mean(got.argmax(-1) == ref.argmax(-1))
    assert agree >= 0.9, agree
    assert low.info.quant == {"bfloat16": "bf16", "float16": "fp16"}[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_memory_report_counts_weights_and_cache(device: str) -> None:
    model = tiny_model("llama")  # tied embeddings: counted once
    c = model.config
    runner = make_runner(model, device, slots=3, max_ctx=40)
    runner.forward([SlotWork(0, tuple(random_tokens(20)), 0, logits="all")])
    mem = runner.memory()
    assert isinstance(mem, MemoryReport)
    matrices = c.vocab_size * c.hidden_size + c.n_layers * (
        c.hidden_size * (2 * c.q_size + 2 * c.kv_size) + 3 * c.hidden_size * c.ffn_size
    )
    norms = (2 * c.n_layers + 1) * c.hidden_size
    embed_bytes = 4 * c.vocab_size * c.hidden_size
    # Packed (oneDNN, CPU) tied weights keep a dense gather table beside the packed LM head.
    extra = embed_bytes if runner.packed_weights else 0
    assert mem.weights == 4 * (matrices + norms) + extra
    assert mem.kv_cache == 2 * c.n_layers * 3 * c.n_kv_heads * 40 * c.head_dim * 4
    assert mem.overhead > 0
    assert mem.total == mem.weights + mem.kv_cache + mem.overhead

    # Tied: the LM head reads the whole table each decode step; untied: one embedding row.
    assert runner.decode_bytes_per_step() == mem.weights - extra
    untied = make_runner(tiny_model("llama", tied_embeddings=False), device, slots=1, max_ctx=8)
    assert untied.memory().weights == mem.weights - extra + embed_bytes
    assert untied.decode_bytes_per_step() == mem.weights - extra

    bf16 = make_runner(model, device, slots=3, max_ctx=40, dtype="bfloat16")
    assert bf16.memory().kv_cache == mem.kv_cache // 2


def test_protocol_info_and_close() -> None:
    model = tiny_model("mistral")
    runner = create_runner(
        model, RunnerConfig(slots=2, max_ctx=16, threads=torch.get_num_threads())
    )
    assert isinstance(runner, Runner)
    assert runner.info.backend == "torch" and runner.info.vocab_size == 256
    assert (runner.info.slots, runner.info.max_ctx, runner.info.quant) == (2, 16, "fp32")
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.forward([SlotWork(0, (1,), 0)])
    with pytest.raises(UnsupportedModelError):
        TorchRunner(model, RunnerConfig(quant="Q4_K_M"))
    with pytest.raises(UnsupportedModelError):
        TorchRunner(tiny_model("llama"), RunnerConfig(dtype="float64"))


# -- the embedded real model (SmolLM2-135M-Instruct Q4_1, dequantized to fp32) -----------------

# About 145 tokens of real text: ten 16-token native chunks, three torch-ops chunks of 64 and two
# bf16 chunks of 128, each path crossing chunk boundaries with the cache, at under half the cost
# of the 313-token text these tests first read (the numpy reference is the dearest).
TEXT = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbour, and for more "
    "than a hundred years its keepers had written down the weather twice a day. The logbooks "
    "filled a whole wall of the keeper's cottage: wind from the south-west, visibility six "
    "miles, a fishing boat returned late with a torn sail. When the light was automated in "
    "1987, the last keeper, a quiet man named Thomas Hale, carried the books up the hill to the "
    "village library, where they sat untouched for decades. A student looking for a thesis "
    "topic found them by accident. She noticed that the entries described storms in far more "
    "detail than the official records, which had been kept thirty miles inland."
)


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    try:
        path = embedded_model_path()
    except Exception as exc:  # noqa: BLE001 - the package is optional for this module
        pytest.skip(f"embedded model unavailable: {exc}")
    return load_model(path)


@pytest.fixture(scope="module")
def embedded_tokens(embedded: LoadedModel) -> list[int]:
    tokens = embedded.tokenizer.encode(TEXT)
    assert 129 <= len(tokens) <= 160, len(tokens)  # past one bf16 chunk of 128
    return tokens


@pytest.fixture(scope="module")
def embedded_reference(embedded: LoadedModel, embedded_tokens: list[int]) -> np.ndarray:
    # float32, a quarter less CPU than float64: it differs from float64 by under 1e-5 of the
    # logits' scale, a hundredth of what the tests allow, and the top two logits of every
    # position here are over forty times that difference apart.
    return reference_logits(embedded.config, embedded.weights, embedded_tokens, dtype=np.float32)


# (native_max_tokens, prefill chunk): a runner sending up to 32 tokens to the kernels takes
# 16-token chunks through them and 64-token ones through torch ops on dense matrices; with the
# kernels off the matrices are oneDNN-packed (float32 asked by name: the file's own numbers
# would be held converted to int4 / int8 there, weight_plan.py).
EMBEDDED_PATHS = {"native": (32, 16), "torch-ops-dense": (32, 64), "torch-ops-packed": (0, 64)}


@pytest.mark.parametrize("path", list(EMBEDDED_PATHS))
def test_embedded_model_matches_numpy_reference(
    embedded: LoadedModel, embedded_tokens: list[int], embedded_reference: np.ndarray, path: str
) -> None:
    native_max_tokens, chunk = EMBEDDED_PATHS[path]
    quant = "fp32" if path == "torch-ops-packed" else None
    runner = make_runner(
        embedded, native_max_tokens=native_max_tokens, slots=2, max_ctx=512, quant=quant
    )
    assert runner.packed_weights == (path == "torch-ops-packed")
    assert (runner.native_max_tokens >= chunk) == (path == "native")
    got = prefill_chunks(runner, 1, embedded_tokens, [chunk] * (512 // chunk))
    err = np.abs(got - embedded_reference).max()
    scale = np.abs(embedded_reference).max()
    assert err < 1e-3 * scale, (err, scale)
    assert np.mean(got.argmax(-1) == embedded_reference.argmax(-1)) >= 0.99
    # The model is sane on real text: it predicts the next token far better than chance.
    hits = got[:-1].argmax(-1) == np.array(embedded_tokens[1:])
    assert hits.mean() > 0.3, hits.mean()


def test_embedded_model_bf16_agrees_on_top1(
    embedded: LoadedModel, embedded_tokens: list[int], embedded_reference: np.ndarray
) -> None:
    runner = make_runner(embedded, slots=1, max_ctx=512, dtype="bfloat16")
    got = prefill_chunks(runner, 0, embedded_tokens, [128] * 2)
    agree = np.mean(got.argmax(-1) == embedded_reference.argmax(-1))
    assert agree >= 0.85, agree


def test_budget_and_runner_agree_on_bf16_packing() -> None:
    """The budget's torch-free answer (CPU flags, ONEDNN_MAX_CPU_ISA) is what oneDNN does: on
    a CPU whose oneDNN cannot pack bf16 (an AVX2 laptop; scripts/test's AVX-512-hidden pass)
    both say no, and a bf16 runner works with plain matrices instead of raising."""
    from localinfer.backends.torch import profile as support
    from localinfer.backends.torch.onednn import onednn_available

    packs = onednn_available(torch.bfloat16, torch.device("cpu"))
    assert support.onednn_bf16_expected() == packs
    runner = make_runner(tiny_model(), slots=1, max_ctx=32, dtype="bfloat16")
    assert runner.packed_weights == packs
    (logits,) = runner.forward([SlotWork(0, tuple(random_tokens(5)), 0)])
    assert np.isfinite(logits).all()
