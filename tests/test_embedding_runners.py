"""Embeddings in the runners (backends/*/embedding.py): pooling kinds against the numpy
reference on tiny random models, fed in pieces = at once, an input alone = in a batch, slots left
untouched, and the real embedded model across torch, llama.cpp and MLX.

The numpy reference gives logits; with an untied LM head that is the identity (vocab = hidden =
64) those logits are the final normed hidden states an embedding pools.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import (
    EMBED_PASS_MAX_INPUTS,
    EmbeddingRunner,
    RunnerConfig,
    SlotWork,
    plan_embedding_passes,
)
from localinfer.errors import ContextOverflowError
from localinfer.loading.model import DictWeights, LoadedModel
from tests.reference_numpy import reference_logits
from tests.tiny import random_tokens, tiny_config, tiny_model, tiny_weights

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
POOLINGS = ("mean", "last", "cls")
LENGTHS = (5, 40, 1, 70)  # 70: past mistral's 32-token window


def identity_head_model(arch: str, seed: int = 0) -> LoadedModel:
    config = tiny_config(arch, vocab_size=64, tied_embeddings=False)
    tensors = {name: w for name, w in _named(tiny_weights(config, seed))}
    tensors["lm_head.weight"] = np.eye(64, dtype=np.float32)
    weights = DictWeights(tensors)
    return tiny_model(arch, seed, vocab_size=64, tied_embeddings=False, weights=weights)


def _named(weights: DictWeights) -> list[tuple[str, np.ndarray]]:
    return [(name, weights.get(name)) for name in weights.names()]


def reference_vector(model: LoadedModel, ids: list[int], pooling: str) -> np.ndarray:
    states = reference_logits(model.config, model.weights, ids)  # [n, hidden], normed
    pooled = {"mean": states.mean(axis=0), "last": states[-1], "cls": states[0]}[pooling]
    return pooled / np.linalg.norm(pooled)


def inputs(seed: int = 0) -> list[list[int]]:
    return [random_tokens(n, vocab=64, seed=seed + n) for n in LENGTHS]


def torch_runner(model: LoadedModel, **kw: object):
    runner_module = pytest.importorskip("localinfer.backends.torch.runner")
    cfg: dict[str, object] = {"slots": 2, "max_ctx": 96, "dtype": "float32", "threads": 1, **kw}
    return runner_module.TorchRunner(model, RunnerConfig(**cfg))  # type: ignore[arg-type]


def mlx_runner(model: LoadedModel, **kw: object):
    pytest.importorskip("mlx.core")
    from localinfer.backends.mlx.runner import create_runner

    cfg: dict[str, object] = {"slots": 2, "max_ctx": 96, "dtype": "float32", **kw}
    return create_runner(model, RunnerConfig(**cfg))  # type: ignore[arg-type]


def llamacpp_runner(model: LoadedModel, tmp_path: Path, **kw: object):
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from tests.gguf_writer import write_tiny_gguf
    from tests.model_files import file_model

    path = write_tiny_gguf(tmp_path / "tiny.gguf", model.config, model.weights)
    cfg: dict[str, object] = {"slots": 2, "max_ctx": 96, "threads": 1, **kw}
    return LlamaCppRunner(file_model(path, "F32", model.config), RunnerConfig(**cfg))  # type: ignore[arg-type]


# -- pooling kinds against the numpy reference ---------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_pooling_matches_numpy_reference(arch: str) -> None:
    model = identity_head_model(arch)
    runner = torch_runner(model)
    assert isinstance(runner, EmbeddingRunner)
    for pooling in POOLINGS:
        got = runner.embed(inputs(), pooling)
        assert got.shape == (len(LENGTHS), 64) and got.dtype == np.float32
        for vector, ids in zip(got, inputs(), strict=True):
            np.testing.assert_allclose(vector, reference_vector(model, ids, pooling), atol=1e-5)


@pytest.mark.mlx
@pytest.mark.parametrize("arch", ARCHS)
def test_mlx_pooling_matches_numpy_reference(arch: str) -> None:
    model = identity_head_model(arch)
    runner = mlx_runner(model)
    for pooling in POOLINGS:
        got = runner.embed(inputs(), pooling)
        for vector, ids in zip(got, inputs(), strict=True):
            np.testing.assert_allclose(vector, reference_vector(model, ids, pooling), atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llamacpp_pooling_matches_numpy_reference(arch: str, tmp_path: Path) -> None:
    """llama.cpp keeps K and V in F16: agreement to ~1e-3, not 1e-5. (Not mistral: llama.cpp's
    llama arch has no per-layer window.)"""
    model = identity_head_model(arch)
    runner = llamacpp_runner(model, tmp_path)
    for pooling in POOLINGS:
        got = runner.embed(inputs(), pooling)
        for vector, ids in zip(got, inputs(), strict=True):
            np.testing.assert_allclose(vector, reference_vector(model, ids, pooling), atol=3e-3)


# -- pieces, batches, slots ------------------------------------------------------------------------


def tolerance(runner: object) -> float:
    """llama.cpp's matmuls take other paths for other batch shapes: agreement to 1e-4 there."""
    return 1e-4 if runner.info.backend == "llamacpp" else 2e-6  # type: ignore[attr-defined]


def _runners(model: LoadedModel, tmp_path: Path) -> list[object]:
    out = [torch_runner(model)]
    with contextlib.suppress(pytest.skip.Exception):
        out.append(mlx_runner(model))
    if model.config.sliding_window is None:
        with contextlib.suppress(pytest.skip.Exception):
            out.append(llamacpp_runner(model, tmp_path))
    return out


@pytest.mark.parametrize("pooling", POOLINGS)
def test_fed_in_small_pieces_equals_at_once(pooling: str, tmp_path: Path) -> None:
    """A pass fed 7 tokens at a time (sequences cut mid-way, several per feed) pools as one fed
    everything at once: the scratch cache carries each sequence across feeds."""
    model = identity_head_model("llama", seed=2)
    for runner in _runners(model, tmp_path):
        whole = runner.embed(inputs(), pooling)
        embedding = runner.start_embedding(inputs(), pooling)
        feeds = 0
        while not embedding.done:
            assert embedding.feed(7) <= 7
            feeds += 1
        assert feeds == -(-sum(LENGTHS) // 7)  # every feed used its whole budget but the last
        np.testing.assert_allclose(embedding.vectors(), whole, atol=tolerance(runner))
        embedding.close()


def test_alone_equals_in_a_batch_of_other_lengths(tmp_path: Path) -> None:
    model = identity_head_model("qwen3", seed=4)
    batch = inputs(seed=10)
    for runner in _runners(model, tmp_path):
        together = runner.embed(batch, "mean")
        for i, ids in enumerate(batch):
            alone = runner.embed([ids], "mean")[0]
            np.testing.assert_allclose(alone, together[i], atol=tolerance(runner))


def test_embedding_leaves_slot_caches_untouched(tmp_path: Path) -> None:
    """A slot mid-sequence decodes on after an embedding exactly as without it."""
    model = identity_head_model("llama", seed=5)
    prompt = tuple(random_tokens(20, vocab=64, seed=6))
    for runner in _runners(model, tmp_path):
        runner.forward([SlotWork(0, prompt, 0)])
        before = runner.forward([SlotWork(0, (7,), 20)])[0]
        runner.truncate(0, 20)
        runner.embed(inputs(seed=3), "mean")
        assert runner.slot_length(0) == 20
        after = runner.forward([SlotWork(0, (7,), 20)])[0]
        np.testing.assert_array_equal(after, before)


def test_torch_small_feeds_run_the_native_kernels_in_the_scratch_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Feeds up to the runner's native limit (what an engine feeds beside decoding streams) run
    cpu_kernels.c bound to the pass's own cache: they pool as the numpy reference, and a slot
    mid-sequence decodes on exactly as without them."""
    from localinfer.backends.torch.native_forward import NativeForward

    model = identity_head_model("qwen3", seed=7)
    runner = torch_runner(model)
    if runner.native_max_tokens == 0:
        pytest.skip("the native kernels are not in use on this machine")
    native_calls: list[int] = []
    original = NativeForward.hidden_states

    def counted(self, tokens, slots, positions):
        native_calls.append(int(tokens.shape[0]))
        return original(self, tokens, slots, positions)

    monkeypatch.setattr(NativeForward, "hidden_states", counted)
    prompt = tuple(random_tokens(20, vocab=64, seed=6))
    runner.forward([SlotWork(0, prompt, 0)])
    before = runner.forward([SlotWork(0, (7,), 20)])[0]
    runner.truncate(0, 20)
    native_calls.clear()
    piece = min(8, runner.native_max_tokens)
    embedding = runner.start_embedding(inputs(), "mean")
    feeds = 0
    while not embedding.done:
        embedding.feed(piece)
        feeds += 1
    assert len(native_calls) == feeds and max(native_calls) <= piece
    for vector, ids in zip(embedding.vectors(), inputs(), strict=True):
        np.testing.assert_allclose(vector, reference_vector(model, ids, "mean"), atol=1e-5)
    embedding.close()
    assert runner.forward([SlotWork(0, (7,), 20)])[0].tolist() == before.tolist()


def test_pass_refuses_what_it_cannot_take(tmp_path: Path) -> None:
    model = identity_head_model("llama")
    for runner in _runners(model, tmp_path):
        with pytest.raises(ContextOverflowError):
            runner.start_embedding([random_tokens(97, vocab=64)], "mean")  # max_ctx 96
        with pytest.raises(ValueError, match="no tokens"):
            runner.start_embedding([[1, 2], []], "mean")
        with pytest.raises(ValueError, match="out of range"):
            runner.start_embedding([[1, 64]], "mean")
        with pytest.raises(ValueError, match="at most"):
            runner.start_embedding([[1]] * (EMBED_PASS_MAX_INPUTS + 1), "mean")


def test_plan_embedding_passes_sorts_and_bounds_cells() -> None:
    lengths = [30, 2, 90, 3, 2, 31]
    passes = plan_embedding_passes(lengths, max_cells=64, max_inputs=3)
    assert sorted(i for p in passes for i in p) == list(range(len(lengths)))
    for group in passes:
        assert len(group) <= 3
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 64
    assert passes == [[1, 4, 3], [0, 5], [2]]  # by length; 90 alone: it exceeds the cells


# -- the embedded model across runners ----------------------------------------------------------


TEXTS = [
    "The cat sat on the mat.",
    "hello",
    "Quantum computers keep their qubits cold; a long sentence gives mean pooling work. " * 3,
]


@pytest.fixture(scope="module")
def embedded_ids() -> tuple[LoadedModel, list[list[int]]]:
    from localinfer.session import open_model

    model = open_model(None).model
    return model, [model.tokenizer.encode(t, add_special_tokens=True) for t in TEXTS]


def test_runners_agree_on_the_embedded_model(embedded_ids) -> None:
    """torch vs llama.cpp vs MLX (where installed): cosine >= 0.999 per text and pooling."""
    from localinfer.backends.torch.runner import TorchRunner

    model, ids = embedded_ids
    config = RunnerConfig(slots=1, max_ctx=256, threads=1)
    runners = {"torch": TorchRunner(model, config)}
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

    runners["llamacpp"] = LlamaCppRunner(model, config)
    with contextlib.suppress(pytest.skip.Exception):
        runners["mlx"] = mlx_runner(model, max_ctx=256, slots=1)
    for pooling in POOLINGS:
        # mlx[cpu] on Linux has no BLAS (a second a text here): MLX's poolings are checked
        # against numpy on tiny models above, so on this model it runs one.
        vectors = {
            name: r.embed(ids, pooling)
            for name, r in runners.items()
            if name != "mlx" or pooling == "mean"
        }
        for name, got in vectors.items():
            cosines = np.sum(got * vectors["torch"], axis=1)
            assert cosines.min() >= 0.999, (name, pooling, cosines)
    for runner in runners.values():
        runner.close()


def test_llamacpp_reports_its_embedding_context(embedded_ids) -> None:
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

    model, ids = embedded_ids
    runner = LlamaCppRunner(model, RunnerConfig(slots=1, max_ctx=256, threads=1))
    before = runner.memory()
    runner.embed(ids, "mean")
    after = runner.memory()
    # Its KV alone: 256 cells x 30 layers x (k + v) 192 dims x 2 bytes.
    assert after.overhead - before.overhead >= 256 * 30 * 2 * 192 * 2
    assert after.kv_cache == before.kv_cache  # the slots' cache is the same size
    runner.close()
