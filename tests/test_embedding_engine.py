"""Embedding jobs in the engine (localinfer/engine/embedding.py): they run between the decode
steps a piece at a time, never change a stream's tokens, never take a slot or evict a cached
prefix, share the queue bound, and fail alone.

Tiny torch models with the engine stepped by hand (step counts, interleaving), and the embedded
model on llama.cpp with the engine's own thread (a real stream beside a real job).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import RunnerConfig
from localinfer.engine import (
    EmbeddingError,
    EmbeddingRequest,
    Engine,
    Request,
    SamplingParams,
)
from localinfer.engine.embedding import EmbeddingPacer
from localinfer.errors import (
    ContextOverflowError,
    InvalidParameterError,
    QueueFullError,
    UnsupportedModelError,
)
from tests.test_engine_model import ByteTokenizer, HashRunner
from tests.test_engine_torch import solo_greedy
from tests.tiny import random_tokens, tiny_model

torch_runner = pytest.importorskip("localinfer.backends.torch.runner")

CHUNK = 16  # prefill_chunk: also the embedding tokens one step may run
JOB = [random_tokens(n, seed=n) for n in (40, 3, 25, 60, 1, 18)]  # 147 tokens, ~10 steps


@pytest.fixture
def runner(one_torch_thread: None):
    model = tiny_model("llama", seed=1, path=Path("/dev/null"), tokenizer=ByteTokenizer((2,)))
    r = torch_runner.TorchRunner(model, RunnerConfig(slots=2, max_ctx=128))
    yield r
    r.close()


def manual_engine(runner, **kw: object) -> Engine:
    return Engine(runner, runner_tokenizer(), background=False, prefill_chunk=CHUNK, **kw)


def runner_tokenizer() -> ByteTokenizer:
    return ByteTokenizer(eos_ids=(2,))


def ticks() -> Callable[[], float]:
    """A clock that advances one second per reading: the pacer reads it once before and once
    after a feed, so each feed and each step's work between feeds "take" one second."""
    count = itertools.count()
    return lambda: float(next(count))


def test_job_interleaves_with_a_decoding_stream_and_leaves_its_tokens(runner) -> None:
    prompt = random_tokens(12, seed=3)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    expected = solo_greedy(runner, prompt, 30, frozenset())
    engine = manual_engine(runner)
    engine._scheduler.embeddings.pacer = EmbeddingPacer(share=0.5, slice_tokens=4, clock=ticks())
    stream = engine.submit(Request(prompt, params))
    for _ in range(3):
        engine.step()  # prefill, then decoding
    job = engine.embed(EmbeddingRequest(JOB, "mean"))
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    assert sum(r.embedded for r in reports) == sum(len(x) for x in JOB)
    decoding = [r for r in reports if stream.request_id in r.decoded]
    assert len(decoding) == 27  # the stream decoded in every step until it finished: never frozen
    # Beside the stream: a slice of at most 4 tokens, then a step without one (the slice's second
    # is repaid at half a second per step), and so on; the first pass ([1, 3, 18, 25]: 47 tokens)
    # ends on a 3-token slice, as a feed never crosses passes. Once the stream is done the job
    # takes whole chunks.
    assert [r.embedded > 0 for r in decoding] == [True, False] * 13 + [True]
    assert [r.embedded for r in decoding if r.embedded] == [4] * 11 + [3, 4, 4]
    assert [r.embedded for r in reports[len(decoding) :]] == [CHUNK] * 5 + [12]
    assert list(stream.result().token_ids) == expected
    vectors = job.result().vectors
    np.testing.assert_allclose(vectors, runner.embed(JOB, "mean"), atol=2e-6)
    assert job.result().prompt_tokens == 147


def test_prompt_prefill_goes_first_within_the_step_budget(runner) -> None:
    engine = manual_engine(runner)
    prompt = engine.submit(Request(random_tokens(40, seed=9), SamplingParams(max_tokens=2)))
    job = engine.embed(EmbeddingRequest(JOB))
    reports = []
    while engine.has_work():
        reports.append(engine.step())
    assert [r.embedded for r in reports[:3]] == [1, 1, CHUNK - 8]  # the prompt took 16, 16, 8
    assert all(r.embedded <= max(1, CHUNK - sum(r.prefilled.values())) for r in reports)
    assert prompt.result().finish_reason == "length" and job.result().prompt_tokens == 147


def test_job_takes_no_slot_and_keeps_cached_prefixes(runner) -> None:
    engine = manual_engine(runner, prefix_reuse=True)
    prompt = random_tokens(30, seed=8)
    first = engine.submit(Request(prompt, SamplingParams(max_tokens=4)))
    first.result()
    job = engine.embed(EmbeddingRequest(JOB))
    assert engine.metrics().queue_depth == 1 and engine.metrics().slots_busy == 0
    job.result()
    again = engine.submit(Request(prompt, SamplingParams(max_tokens=4)))
    report = engine.step()
    assert report.reused[again.request_id] == 29  # all but the last prompt token, from cache
    assert list(again.result().token_ids) == list(first.result().token_ids)


def test_real_stream_and_job_both_finish_on_llamacpp() -> None:
    """The embedded model on llama.cpp, engine thread running: a long greedy stream gives the same
    tokens with a 10-text job embedded while it streams, and the job gives what it gives alone."""
    pytest.importorskip("llama_cpp")
    from localinfer.session import open_session

    # Ten texts of three lengths (about 150 tokens in all): the job ends well inside the 48-token
    # stream beside it, and each token more is embedding work done twice (alone and beside it).
    texts = [f"Text number {i}: " + "some words about embeddings " * (i % 3 + 1) for i in range(10)]
    with open_session(None, backend="llamacpp", slots=2, ctx=512, threads=1) as session:
        ids = session.chat_prompt_ids([{"role": "user", "content": "Tell me about the sea."}])
        request = Request(ids, SamplingParams(max_tokens=48, ignore_eos=True))
        alone = session.engine.generate(request).token_ids
        vectors_alone = session.embed(texts).vectors
        handle = session.engine.submit(request)
        events = iter(handle)
        next(events)  # the stream has started
        together = session.embed(texts)  # queued while the stream runs
        assert handle.result().token_ids == alone
    np.testing.assert_allclose(together.vectors, vectors_alone, atol=1e-4)
    cosines = np.sum(together.vectors * vectors_alone, axis=1)
    assert cosines.min() > 0.99999


def test_jobs_share_the_queue_bound(runner) -> None:
    engine = manual_engine(runner, max_queue=1)
    running = engine.embed(EmbeddingRequest(JOB))  # the running job takes no queue place
    waiting = engine.embed(EmbeddingRequest([[5, 6]]))  # the one queue place
    with pytest.raises(QueueFullError):
        engine.embed(EmbeddingRequest([[7]]))
    # Generation still gets the free slots (a slot is not a queue place), not a second place.
    engine.submit(Request([9, 9], SamplingParams(max_tokens=2)))
    engine.submit(Request([9, 8], SamplingParams(max_tokens=2)))
    with pytest.raises(QueueFullError):
        engine.submit(Request([9, 7], SamplingParams(max_tokens=2)))
    assert engine.metrics().queue_depth == 4  # two jobs, two requests waiting for a step
    assert running.result().vectors.shape == (6, 64)
    assert waiting.result().vectors.shape == (1, 64)


def test_aborted_job_ends_with_an_error_and_the_engine_goes_on(runner) -> None:
    engine = manual_engine(runner)
    job = engine.embed(EmbeddingRequest(JOB))
    engine.step()
    job.abort()
    with pytest.raises(EmbeddingError, match="aborted"):
        job.result()
    assert not engine.has_work()
    assert engine.embed(EmbeddingRequest([[4, 5, 6]])).result().vectors.shape == (1, 64)


class FailingEmbeddings:
    """A runner whose embedding passes raise on one token; everything else is the real runner's."""

    def __init__(self, runner, poison: int) -> None:
        self._runner, self._poison = runner, poison

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def start_embedding(self, inputs, pooling):
        if any(self._poison in ids for ids in inputs):
            raise RuntimeError("poisoned input")
        return self._runner.start_embedding(inputs, pooling)

    def embed(self, inputs, pooling):
        return self._runner.embed(inputs, pooling)


def test_failing_job_fails_alone(runner) -> None:
    engine = Engine(FailingEmbeddings(runner, poison=13), runner_tokenizer(), background=False)
    stream = engine.submit(Request([3, 4, 5], SamplingParams(max_tokens=8, ignore_eos=True)))
    bad = engine.embed(EmbeddingRequest([[13, 14]]))
    good = engine.embed(EmbeddingRequest([[15, 16]]))
    with pytest.raises(EmbeddingError, match="poisoned input"):
        bad.result()
    assert good.result().vectors.shape == (1, 64)
    assert stream.result().finish_reason == "length"


def test_requests_refused_before_any_compute(runner) -> None:
    engine = manual_engine(runner)
    cases = [
        (EmbeddingRequest([]), InvalidParameterError, r"^input: nothing to embed"),
        (EmbeddingRequest([[1], []]), InvalidParameterError, r"^input\[1\]: empty"),
        (EmbeddingRequest([[1, 256]]), InvalidParameterError, r"^input\[0\]: token id 256"),
        (EmbeddingRequest([[1] * 129]), ContextOverflowError, r"129 tokens \(input\[0\]\)"),
        (EmbeddingRequest([[1]], pooling="max"), InvalidParameterError, r"^pooling: 'max'"),  # type: ignore[arg-type]
    ]
    for request, error, message in cases:
        with pytest.raises(error, match=message):
            engine.embed(request)
    assert not engine.has_work()
    assert engine.embed(EmbeddingRequest([[1] * 128])).result().vectors.shape == (1, 64)


def test_runner_without_embeddings_is_refused() -> None:
    engine = Engine(HashRunner(slots=1), runner_tokenizer(), background=False)
    with pytest.raises(UnsupportedModelError, match="numpy-hash runner does not compute"):
        engine.embed(EmbeddingRequest([[1, 2]]))


def test_closing_the_engine_fails_waiting_jobs(runner) -> None:
    engine = Engine(runner, runner_tokenizer(), background=False)
    job = engine.embed(EmbeddingRequest(JOB))
    engine.close()
    with pytest.raises(EmbeddingError, match="engine closed"):
        job.result()
    with pytest.raises(QueueFullError):
        engine.embed(EmbeddingRequest([[1]]))
