"""The torch runner's decode step on CUDA (backends/torch/decode_pieces.py, cuda_graphs.py).

On a CPU: graphs are never built, and the step cut into pieces at attention (what the graphs
capture) runs eagerly through the runner's own routing, equal to the ordinary forward. On CUDA
(marked ``gpu``, run by scripts/gpu-check): replayed graphs equal eager steps over several steps
and batch sizes, a failed capture falls back to eager, and the embedded model's greedy answers
through the engine are the same with graphs and without."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.runner_sampling import RunnerSampling  # noqa: E402
from localinfer.backends.torch import cuda_graphs  # noqa: E402
from localinfer.backends.torch.cuda_graphs import DISABLE_ENV, graphs_wanted  # noqa: E402
from localinfer.backends.torch.decode_pieces import DecodePieces, is_decode_batch  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SLOTS = 4
HISTORIES = {0: 10, 1: 10, 2: 23, 3: 5}  # slot -> prompt length; 0 and 1 share a decode run
# Each step's slots, given out of slot order: sizes 4, 1, 3, 4 again (a replay on CUDA), 2, 1.
STEPS = [(3, 0, 2, 1), (2,), (1, 3, 0), (0, 1, 2, 3), (3, 1), (0,)]


class EagerPieces:
    """DecodeGraphs' place in the runner, with the pieces run eagerly instead of replayed: the
    decomposition the graphs capture, checked where there is no GPU."""

    def __init__(self, runner: TorchRunner) -> None:
        self.pieces = DecodePieces(runner._model, runner._cache, runner.config.slots)  # noqa: SLF001
        self.steps = 0

    def handles(self, batch: list[SlotWork]) -> bool:
        return is_decode_batch(batch, self.pieces.max_batch)

    def logits(self, packed, groups) -> torch.Tensor:  # noqa: ANN001
        self.steps += 1
        return self.pieces.run(self.pieces.load(packed), groups)


def _runner(arch: str, device: str, dtype: str = "float32", **overrides: object) -> TorchRunner:
    config = RunnerConfig(slots=SLOTS, max_ctx=64, dtype=dtype, device=device)
    # Torch ops on every forward: the path CUDA runs (the CPU's native kernels are off).
    return TorchRunner(tiny_model(arch, **overrides), config, native_max_tokens=0)


def _decode_all(runner: TorchRunner, sample: bool = False) -> list[np.ndarray]:
    """Prefill every slot, then STEPS; every step's outputs in batch order, concatenated. With
    ``sample``, slot 2 draws greedily in the runner."""
    for slot, n in HISTORIES.items():
        runner.forward([SlotWork(slot, tuple(random_tokens(n, seed=slot)), 0)])
    outs = []
    for step, slots in enumerate(STEPS):
        batch = [
            SlotWork(
                s,
                ((7 * step + s) % 256,),
                runner.slot_length(s),
                sample=RunnerSampling(stream=1, seed=0) if sample and s == 2 else None,
            )
            for s in slots
        ]
        outs.extend(runner.forward(batch))
    return outs


def _assert_same(got: list[np.ndarray], want: list[np.ndarray], tol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def test_graphs_are_for_cuda_only_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not graphs_wanted(torch.device("cpu"))
    assert graphs_wanted(torch.device("cuda"))
    monkeypatch.setenv(DISABLE_ENV, "0")
    assert not graphs_wanted(torch.device("cuda"))
    monkeypatch.delenv(DISABLE_ENV)
    assert _runner("llama", "cpu")._graphs is None  # noqa: SLF001 - never built on a CPU


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_the_pieces_equal_the_forward_on_cpu(arch: str) -> None:
    """Grouped-query heads (2 KV heads for 4), a sliding window shorter than the histories
    (mistral), biases (qwen2), q/k norms (qwen3); greedy sampling in the runner beside logits."""
    overrides = {"sliding_window": 8} if arch == "mistral" else {}
    want = _decode_all(_runner(arch, "cpu", **overrides), sample=True)
    runner = _runner(arch, "cpu", **overrides)
    runner._graphs = pieces = EagerPieces(runner)  # noqa: SLF001
    got = _decode_all(runner, sample=True)
    assert pieces.steps == len(STEPS)  # every decode step went through the pieces
    _assert_same(got, want, 1e-5)


# -- on CUDA ------------------------------------------------------------------------------------


def _cuda_pair(
    arch: str, dtype: str, monkeypatch: pytest.MonkeyPatch, **overrides: object
) -> tuple[TorchRunner, TorchRunner]:
    """(with graphs, eager) runners of the same model on CUDA."""
    monkeypatch.setenv(DISABLE_ENV, "0")
    eager = _runner(arch, "cuda", dtype, **overrides)
    monkeypatch.delenv(DISABLE_ENV)
    graphs = _runner(arch, "cuda", dtype, **overrides)
    assert eager._graphs is None and graphs._graphs is not None  # noqa: SLF001
    return graphs, eager


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_steps_equal_eager_steps(
    arch: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {"sliding_window": 8} if arch == "mistral" else {}
    graphs, eager = _cuda_pair(arch, dtype, monkeypatch, **overrides)
    got, want = _decode_all(graphs, sample=True), _decode_all(eager, sample=True)
    assert graphs._graphs.captured == [1, 2, 3, 4]  # noqa: SLF001 - size 4 ran twice: a replay
    # The same kernels on the same inputs; bf16 leaves room for a different GEMM choice.
    _assert_same(got, want, 1e-4 if dtype == "float32" else 5e-2)
    # More steps on the captured sizes: the graphs keep reading the growing caches.
    more_got, more_want = _decode_all(graphs), _decode_all(eager)
    _assert_same(more_got, more_want, 1e-4 if dtype == "float32" else 5e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_failed_capture_leaves_the_steps_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("capture refused by the test")

    graphs, eager = _cuda_pair("llama", "float32", monkeypatch)
    monkeypatch.setattr(cuda_graphs.torch.cuda, "graph", refuse)
    got, want = _decode_all(graphs), _decode_all(eager)
    assert not graphs._graphs.enabled and graphs._graphs.captured == []  # noqa: SLF001
    _assert_same(got, want, 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_embedded_model_greedy_answers_are_the_same_with_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from localinfer.engine import Engine, Request, SamplingParams
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    try:
        model = load_model(embedded_model_path())
    except Exception as exc:  # noqa: BLE001 - the package is optional for this module
        pytest.skip(f"embedded model unavailable: {exc}")
    tok = model.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    answers = []
    for graphs in ("1", "0"):
        monkeypatch.setenv(DISABLE_ENV, graphs)
        runner = TorchRunner(model, RunnerConfig(slots=3, max_ctx=128, device="cuda"))
        assert (runner._graphs is not None) == (graphs == "1")  # noqa: SLF001
        with Engine(runner, tok, prefill_chunk=16) as engine:
            params = SamplingParams(max_tokens=16)
            handles = [engine.submit(Request(tok.encode(t), params=params)) for t in texts]
            answers.append([list(h.result().token_ids) for h in handles])
        if graphs == "1":
            assert runner._graphs.captured  # noqa: SLF001 - the decode steps were replayed
        runner.close()
    assert answers[0] == answers[1]
