"""``--kv-dtype``: llama.cpp's K and V cache in F32, F16, BF16, Q8_0 or Q4_0 (cache_types.py).

- The cache holds the asked type: llama.cpp's own allocation is the budget's KV figure, and the
  rows' sizes follow the type (Q8_0 17/32 of F16, Q4_0 9/32, F32 2x).
- Numerics on the embedded model, teacher-forced against an F32 cache: fewer bits, more error
  (scripts/bench-kv-dtype measures them on the evaluation text: top-1 0.960 / 0.959 / 0.874 for
  F16 / Q8_0 / Q4_0).
- Batched = single, copied prefix = cold and restored snapshot = original hold with a quantized
  cache as with F16; a snapshot of another cache type is refused and the slot keeps what it held.
- torch and MLX keep the cache in their compute dtype: another is refused with one line by the
  runner choice and by the budget alike, and the budget suggests a quantized cache only where
  the backend has one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from localinfer.backend_budget import compute_budget  # noqa: E402
from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from localinfer.backends.select import BackendChoice, create_runner  # noqa: E402
from localinfer.budget.compute import BudgetRequest  # noqa: E402
from localinfer.errors import InvalidParameterError, UnsupportedModelError  # noqa: E402
from localinfer.loading.embedded import embedded_model_path  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from localinfer.loading.model import LoadedModel  # noqa: E402
from tests.llamacpp_helpers import cfg, prompt  # noqa: E402

pytestmark = pytest.mark.llamacpp

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type with an oil-based ink and a wooden press adapted from those "
    "used for wine. Within decades, presses spread across Europe, and the cost of books fell."
)


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    return load_model(embedded_model_path())


def run_all(runner: LlamaCppRunner, ids: tuple[int, ...], slot: int = 0) -> np.ndarray:
    start = runner.slot_length(slot)
    return runner.forward([SlotWork(slot, ids, start, "all")])[0]


@pytest.mark.parametrize(("kv", "vs_f16"), [("q8_0", 17 / 32), ("q4_0", 9 / 32), ("f32", 2.0)])
def test_the_cache_holds_the_asked_type_and_the_budgeted_bytes(
    embedded: LoadedModel, kv: str, vs_f16: float
) -> None:
    f16 = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=512))
    f16_bytes = f16.kv_cache_bytes_computed()
    f16.close()
    runner = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=512, kv_dtype=kv))
    try:
        assert runner.kv_cache_bytes_computed() == round(f16_bytes * vs_f16)
        logged = runner.memory().kv_cache  # llama.cpp's own log line, in MiB to 2 decimals
        assert abs(logged - runner.kv_cache_bytes_computed()) <= 0.005 * 2**20
        if kv != "f32":  # F32's attention is the measured plan's choice
            assert runner.flash_attention is True
        budget = compute_budget(
            BudgetRequest(str(embedded.path), 512, 2, None, backend="llamacpp", kv_dtype=kv)
        )
        assert budget.kv_dtype == kv
        assert budget.kv_cache_bytes == runner.kv_cache_bytes_computed()
        assert f"kv={kv}" in runner.kv_cache.layout()
    finally:
        runner.close()


def test_fewer_bits_more_error_against_an_f32_cache(embedded: LoadedModel) -> None:
    ids = tuple(embedded.tokenizer.encode(TEXT))
    logits = {}
    for kv in ("f32", "f16", "q8_0", "q4_0"):
        runner = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=256, kv_dtype=kv))
        logits[kv] = run_all(runner, ids)[:-1]
        runner.close()
    ref = logits["f32"]
    err = {kv: float(np.abs(v - ref).max() / np.abs(ref).max()) for kv, v in logits.items()}
    agree = {kv: float(np.mean(v.argmax(-1) == ref.argmax(-1))) for kv, v in logits.items()}
    assert 0 < err["q8_0"] < err["q4_0"], err  # a type silently ignored would tie
    assert agree["q8_0"] >= 0.9 and agree["q4_0"] >= 0.75, agree


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_batched_equals_single_with_a_quantized_cache(embedded: LoadedModel, kv: str) -> None:
    prompts = {0: prompt(5, 10), 1: prompt(17, 11), 2: prompt(30, 12)}
    alone = {}
    single = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=128, kv_dtype=kv))
    for slot, p in prompts.items():
        single.release(0)
        alone[slot] = _greedy(single, {0: p}, 6)[0]
    single.close()
    batched = LlamaCppRunner(embedded, cfg(slots=3, max_ctx=128, kv_dtype=kv))
    together = _greedy(batched, prompts, 6)
    batched.close()
    for slot in prompts:
        assert together[slot][0] == alone[slot][0]
        for got, want in zip(together[slot][1], alone[slot][1], strict=True):
            np.testing.assert_array_equal(got, want)


def _greedy(runner: LlamaCppRunner, prompts: dict[int, tuple[int, ...]], steps: int) -> dict:
    """Every slot's prompt in one batch, then greedy steps together: {slot: (tokens, logits)}."""
    out: dict[int, tuple[list[int], list[np.ndarray]]] = {s: ([], []) for s in prompts}
    batch = [SlotWork(s, p, 0) for s, p in prompts.items()]
    for _ in range(steps):
        for work, logits in zip(batch, runner.forward(batch), strict=True):
            out[work.slot][0].append(int(logits[0].argmax()))
            out[work.slot][1].append(logits[0])
        batch = [SlotWork(s, (out[s][0][-1],), runner.slot_length(s)) for s in prompts]
    return out


def test_transfers_keep_a_quantized_cache_exact(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=3, max_ctx=256, kv_dtype="q8_0"))
    head, rest = prompt(60, 1), prompt(20, 2)
    try:
        run_all(runner, head)
        snap = runner.kv_cache.snapshot(0, 60)
        runner.kv_cache.copy_prefix(0, 1, 40)
        want = run_all(runner, rest)  # slot 0 goes on from its 60 tokens
        run_all(runner, prompt(30, 3), slot=2)
        runner.kv_cache.restore(2, snap)
        np.testing.assert_array_equal(run_all(runner, rest, slot=2), want)
        cold = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=256, kv_dtype="q8_0"))
        run_all(cold, head[:40])
        np.testing.assert_array_equal(run_all(runner, rest, slot=1), run_all(cold, rest))
        cold.close()
    finally:
        runner.close()
    other = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=256))  # F16
    try:
        before = run_all(other, prompt(10, 4))
        with pytest.raises(ValueError):
            other.kv_cache.restore(0, snap)
        assert other.slot_length(0) == 10
        follow = prompt(3, 5)
        kept = run_all(other, follow)
        other.release(0)
        np.testing.assert_array_equal(run_all(other, prompt(10, 4)), before)
        np.testing.assert_array_equal(run_all(other, follow), kept)
    finally:
        other.close()


def test_torch_and_mlx_refuse_another_cache_type(embedded: LoadedModel) -> None:
    pytest.importorskip("torch")  # the runner choice needs it installed to refuse
    for name in ("torch", "mlx"):
        profile = BackendChoice(name, "test").profile
        assert profile.kv_dtype_refusal(None, "float32") is None
        assert profile.kv_dtype_refusal("f32", "float32") is None  # its own, named
        words = profile.kv_dtype_refusal("q8_0", "float32")
        assert words is not None and "--backend llamacpp" in words
        assert "--dtype bfloat16" in (profile.kv_dtype_refusal("bf16", "float32") or "")
    config = RunnerConfig(slots=1, max_ctx=64, kv_dtype="q4_0")
    with pytest.raises(UnsupportedModelError, match="compute dtype"):
        create_runner(embedded, config, BackendChoice("torch", "test"))
    request = BudgetRequest(str(embedded.path), 2048, 1, None, backend="torch", kv_dtype="q8_0")
    with pytest.raises(UnsupportedModelError, match="compute dtype"):
        compute_budget(request)
    with pytest.raises(InvalidParameterError, match="unknown KV cache dtype"):
        LlamaCppRunner(embedded, cfg(kv_dtype="q5_1"))


def test_the_budget_suggests_a_quantized_cache_only_for_llama_cpp(embedded: LoadedModel) -> None:
    """Too little memory for 32k tokens: llama.cpp is told --kv-dtype, torch is not."""
    from localinfer.budget.memory import DeviceMemory

    memory = DeviceMemory("cpu", kind="cpu", available=400 * 2**20, total=400 * 2**20)
    changes = {}
    for backend in ("llamacpp", "torch"):
        request = BudgetRequest(str(embedded.path), 8192, 4, None, backend=backend)
        report = compute_budget(request, memory=memory)
        assert not report.fits
        changes[backend] = [s.change for s in report.suggestions]
    assert any("--kv-dtype" in c for c in changes["llamacpp"]), changes
    assert not any("--kv-dtype" in c for c in changes["torch"]), changes


def test_a_session_with_a_q4_0_cache_answers_and_reuses_its_prefix() -> None:
    """open_session(kv_dtype=...) as serve/chat/generate pass --kv-dtype: the engine's prefix
    reuse copies quantized cells, and the reused answer is the cold one."""
    from localinfer.engine import Request, SamplingParams
    from localinfer.session import open_session

    with open_session(
        None, backend="llamacpp", kv_dtype="q4_0", slots=2, ctx=512, threads=1
    ) as session:
        runner = session.engine.runner
        assert isinstance(runner, LlamaCppRunner) and runner.kv_type.name == "q4_0"
        assert session.budget is not None and session.budget.kv_dtype == "q4_0"
        ids = session.chat_prompt_ids([{"role": "user", "content": "Name three rivers."}])
        request = Request(ids, SamplingParams(max_tokens=12, ignore_eos=True))
        cold = session.engine.generate(request)
        warm = session.engine.generate(request)
        from localinfer.tui.host import _predicted_memory  # the chat's memory panel

        parts, _ = _predicted_memory(session)
        assert parts is not None and parts.kv_cache == runner.kv_cache_bytes_computed()
    assert warm.metrics.cached_tokens > 0 and cold.metrics.cached_tokens == 0
    assert warm.token_ids == cold.token_ids


def test_the_command_line_refuses_a_cache_type_the_backend_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's own entry point in this process (a child interpreter would only add ~3 CPU s of
    imports): the refusal is its exit status and its last stderr line."""
    pytest.importorskip("torch")
    from localinfer.cli import main

    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path))
    rc = main(["generate", "hi", "--backend", "torch", "--kv-dtype", "q8_0"])
    assert rc != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "localinfer: error: the torch backend keeps its KV cache in its compute dtype "
        "(float32), not q8_0: leave --kv-dtype out, or use --backend llamacpp with a GGUF"
    )


def test_a_quantized_cache_steers_the_automatic_choice_to_llama_cpp(embedded: LoadedModel) -> None:
    """With no --backend, a cache type only llama.cpp holds picks it on a CPU (here the native
    kernels would win otherwise); a type the default holds leaves the choice as it was."""
    from localinfer.backends.select import choose_backend, planned_backend

    facts = (embedded.format, embedded.file_quant, embedded.config.arch)
    default = choose_backend(None, *facts)
    if default.device != "cpu":
        pytest.skip("the automatic choice here is a GPU backend")
    assert choose_backend(None, *facts, kv_dtype="q4_0").name == "llamacpp"
    assert planned_backend("cpu", None, *facts, kv_dtype="q8_0") == "llamacpp"
    own = "f32" if default.name == "torch" else "f16"
    assert choose_backend(None, *facts, kv_dtype=own) == default
    report = compute_budget(BudgetRequest(str(embedded.path), 512, 1, None, kv_dtype="q8_0"))
    assert report.backend == "llamacpp"


def test_embeddings_keep_the_cache_type_too(embedded: LoadedModel) -> None:
    """The embedding context (a second llama.cpp context) holds the asked type as well."""
    inputs = [prompt(20, 7), prompt(33, 8)]
    vectors, kv_bytes = {}, {}
    for kv in ("f16", "q8_0"):
        runner = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=256, kv_dtype=kv))
        vectors[kv] = runner.embed(inputs, "mean")
        kv_bytes[kv] = runner._embedding_buffers.kv  # llama.cpp's log of that context
        runner.close()
    assert abs(kv_bytes["q8_0"] / kv_bytes["f16"] - 17 / 32) < 0.01, kv_bytes
    a, b = vectors["f16"], vectors["q8_0"]
    cosines = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cosines.min() > 0.99 and not np.array_equal(a, b)
