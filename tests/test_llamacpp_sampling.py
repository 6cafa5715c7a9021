"""Tokens drawn inside llama.cpp (backends/llamacpp/sampling.py) against the engine's host sampler:
the same distribution for every mix of temperature, top-k, min-p and top-p, the same greedy tokens,
and, through the engine, the same answers with the runner sampling and without it."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from localinfer.backends.base import SlotWork  # noqa: E402
from localinfer.backends.llamacpp.runner import LlamaCppRunner  # noqa: E402
from localinfer.backends.runner_sampling import RunnerSampling  # noqa: E402
from localinfer.engine import Engine  # noqa: E402
from localinfer.engine.sampler import sampling_probs  # noqa: E402
from localinfer.engine.types import Request, SamplingParams  # noqa: E402
from localinfer.loading.embedded import embedded_model_path  # noqa: E402
from localinfer.session import open_model  # noqa: E402
from tests.llamacpp_helpers import cfg, prompt, tiny_setup  # noqa: E402
from tests.model_files import file_model  # noqa: E402
from tests.sampling_checks import assert_draws_follow

pytestmark = pytest.mark.llamacpp

DRAWS = 6000
# The tiny model's logits spread over ~8 units (one token holds 0.8 at temperature 1): these
# temperatures spread the mass over tens of tokens, so every cut has tokens to cut.
MIXES = [
    dict(temperature=4.0),
    dict(temperature=3.0, top_k=12),
    dict(temperature=4.0, top_p=0.8),
    dict(temperature=3.5, min_p=0.2),
    dict(temperature=5.0, top_k=40, min_p=0.05, top_p=0.9),
]


@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory: pytest.TempPathFactory):
    _, _, model = tiny_setup(tmp_path_factory.mktemp("sampling"), "llama", seed=3)
    runner = LlamaCppRunner(model, cfg(slots=2, max_ctx=64))
    yield runner
    runner.close()


def _draws(
    runner: LlamaCppRunner, spec: RunnerSampling, context: tuple[int, ...], n: int = DRAWS
) -> np.ndarray:
    """``n`` tokens for the same position: feed the last token with ``spec``, then truncate it
    away again, so every draw reads the same logits and only the slot's generator moves on."""
    runner.release(0)
    runner.forward([SlotWork(0, context[:-1], 0)])
    start = len(context) - 1
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        got = runner.forward([SlotWork(0, context[-1:], start, sample=spec)])[0]
        assert got.shape == (1,) and got.dtype == np.int64
        out[i] = got[0]
        runner.truncate(0, start)
    return out


def _logits(runner: LlamaCppRunner, context: tuple[int, ...]) -> np.ndarray:
    runner.release(0)
    return runner.forward([SlotWork(0, context, 0)])[0][-1]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()))
def test_runner_draws_follow_the_host_distribution(tiny_runner, mix: dict) -> None:
    context = prompt(9, seed=5, vocab=256, low=0)
    probs = sampling_probs(SamplingParams(**mix), _logits(tiny_runner, context))
    spec = RunnerSampling(stream=1, seed=1234, **mix)
    counts = np.bincount(_draws(tiny_runner, spec, context), minlength=probs.shape[0])
    assert_draws_follow(counts, probs, DRAWS)


def test_a_seed_repeats_and_a_new_stream_restarts_the_generator(tiny_runner) -> None:
    context = prompt(9, seed=6, vocab=256, low=0)
    first = _draws(
        tiny_runner, RunnerSampling(stream=1, seed=7, temperature=4.0), context, 50
    ).tolist()
    again = _draws(
        tiny_runner, RunnerSampling(stream=2, seed=7, temperature=4.0), context, 50
    ).tolist()
    other = _draws(
        tiny_runner, RunnerSampling(stream=3, seed=8, temperature=4.0), context, 50
    ).tolist()
    assert first == again
    assert first != other


def test_greedy_in_the_runner_is_the_argmax_in_a_mixed_batch(tiny_runner) -> None:
    """Slot 0 samples in the runner, slot 1 returns logits, in one decode: the drawn token is
    the argmax of the logits the same position gives without sampling."""
    a, b = prompt(7, seed=8, vocab=256, low=0), prompt(5, seed=9, vocab=256, low=0)
    want = _logits(tiny_runner, a).argmax()
    tiny_runner.release(0)
    tiny_runner.release(1)
    greedy = RunnerSampling(stream=4, seed=0)
    out = tiny_runner.forward([SlotWork(1, b, 0), SlotWork(0, a, 0, sample=greedy)])
    assert out[0].shape == (1, 256) and out[1].tolist() == [want]


@functools.cache
def _tokenizer():  # noqa: ANN202 - the embedded model's tokenizer
    """Loaded once per worker: every _answers call reads the same file's tokenizer."""
    return open_model(str(embedded_model_path())).model.tokenizer


def _answers(
    sample_in_runner: bool, params: SamplingParams, seeded_in_runner: bool = False
) -> tuple[list[list[int]], int]:
    tokenizer = _tokenizer()
    runner = LlamaCppRunner(file_model(embedded_model_path(), "Q4_1"), cfg(slots=3, max_ctx=256))
    runner.seeded_in_runner = seeded_in_runner  # type: ignore[misc]
    sampled = 0
    forward = runner.forward

    def counting(batch):  # noqa: ANN001, ANN202
        nonlocal sampled
        sampled += sum(w.sample is not None for w in batch)
        return forward(batch)

    runner.forward = counting  # type: ignore[method-assign]
    engine = Engine(runner, tokenizer, sample_in_runner=sample_in_runner)
    try:
        texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
        handles = [engine.submit(Request(tokenizer.encode(t), params=params)) for t in texts]
        return [h.result().token_ids for h in handles], sampled
    finally:
        engine.close()
        runner.close()


def test_greedy_answers_are_the_same_drawn_in_the_runner_or_on_the_host() -> None:
    # Eight tokens a prompt: the same greedy choice drawn in llama.cpp or on the host is what is
    # compared, token by token, whatever the length.
    params = SamplingParams(max_tokens=8, temperature=0.0)
    host, none = _answers(False, params)
    runner, sampled = _answers(True, params)
    assert none == 0 and sampled >= 3 * 8 - 3  # every token but none drawn on the host
    assert runner == host


def test_requests_that_need_the_host_keep_it() -> None:
    """Penalties and log-probabilities read the logits: such requests never sample in the runner."""
    for params in (
        SamplingParams(max_tokens=4, repetition_penalty=1.3),
        SamplingParams(max_tokens=4, logprobs=2),
        SamplingParams(max_tokens=4, temperature=1e-5, seed=1),
    ):
        _, sampled = _answers(True, params, seeded_in_runner=True)
        assert sampled == 0, params


def test_seeded_requests_stay_on_the_host_unless_the_runner_draws_them_cheaper() -> None:
    """llama.cpp's CPU chain costs more than the host's sampler, so by default a seeded request
    stays home; a runner that says otherwise draws it, and the same seed gives the same answer."""
    params = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=42)  # 18 draws
    _, sampled = _answers(True, params)
    assert sampled == 0
    first, sampled = _answers(True, params, seeded_in_runner=True)
    again, _ = _answers(True, params, seeded_in_runner=True)
    assert sampled > 0 and first == again


def test_the_benchmark_compares_both_draws_on_the_embedded_model() -> None:
    from bench.runner_sampling import MIXES, measure

    lines = measure(str(embedded_model_path()), repeats=2)
    assert "49152 vocabulary" in lines[0]
    assert len(lines) == 1 + len(MIXES) and all("runner/host" in line for line in lines[1:])
