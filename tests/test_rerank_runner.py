"""Reranking below the server (issue #37): a tiny random reranker's pairs tokenize as llama.cpp
tokenizes them, and the engine's rank jobs on the llama.cpp runner score them as llama.cpp's own
API does in llama-server's shape (tests/rerank_reference.py), within 1e-4; feeds of any size give
the same scores; what is not a reranker is refused. The comparison with llama-server itself is
tests/test_rerank_llama_server.py (slow: it builds llama-server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from localinfer.engine.embedding import EmbeddingRequest, check_ranks
from localinfer.errors import UnsupportedModelError
from localinfer.facts.pooling import RANK
from localinfer.loading.embedding_spec import embedding_spec
from localinfer.loading.loader import load_model
from localinfer.loading.rerank_spec import is_reranker, pair_ids, rerank_spec
from localinfer.session import Session, open_session
from tests.model_files import TINY_VOCAB_SIZE, write_gguf
from tests.rerank_model import write_tiny_reranker
from tests.rerank_reference import llama_cpp_rerank
from tests.tiny import tiny_config, tiny_weights

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital of France.",
    "The cat sat on the mat <|im_end|> (special-token text in a document)",
    "  12 123, don't\n\nnewlines",
    "long " * 150,  # more than one 512-token chunk with the template
]


@pytest.fixture(scope="module", params=["template", "bos-eos"])
def reranker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rerank") / f"tiny-reranker-{request.param}.gguf"
    return write_tiny_reranker(path, template=request.param == "template")


@pytest.fixture(scope="module")
def session(reranker: Path) -> Iterator[Session]:
    with open_session(str(reranker), backend="llamacpp", slots=1, ctx=1024, threads=1) as s:
        yield s


def test_pairs_are_llama_cpps_tokens(reranker: Path) -> None:
    model = load_model(reranker)
    spec = rerank_spec(model)
    assert is_reranker(model) and spec.labels == ("yes", "no")
    assert (spec.template is not None) == ("template" in reranker.name)
    expected, _ = llama_cpp_rerank(reranker, QUERY, DOCS)
    mine = [pair_ids(model.tokenizer, spec, QUERY, d) for d in DOCS]
    assert mine == expected
    if spec.template is None:  # BOS query EOS document EOS, as the file asks
        assert mine[0][0] == 1 and mine[0][-1] == 2 and mine[0].count(2) == 2


def test_engine_scores_equal_llama_cpps(session: Session, reranker: Path) -> None:
    pairs, expected = llama_cpp_rerank(reranker, QUERY, DOCS)
    assert max(len(p) for p in pairs) > 512  # a pair run in two chunks
    result = session.engine.embed(EmbeddingRequest(pairs, RANK)).result()
    assert result.vectors.shape == (len(DOCS), 2)  # the head's two outputs, "yes" first
    np.testing.assert_allclose(result.vectors.sum(axis=1), 1.0, rtol=1e-5)  # a softmax
    assert np.abs(result.vectors[:, 0] - expected).max() < 1e-4
    assert result.prompt_tokens == sum(len(p) for p in pairs)
    assert np.ptp(expected) > 0.01  # the scores differ: the comparison can fail


def test_any_feed_size_gives_the_same_scores(session: Session, reranker: Path) -> None:
    runner = session.engine.runner
    model = session.model
    spec = rerank_spec(model)
    pairs = [pair_ids(model.tokenizer, spec, QUERY, d) for d in DOCS[:3]]
    results = []
    for budget in (1, 100, 10_000):
        rank = runner.start_rank(pairs)
        try:
            fed = []
            while not rank.done:
                fed.append(rank.feed(budget))
            results.append(rank.vectors())
        finally:
            rank.close()
        assert all(n >= 1 for n in fed) and sum(fed) == sum(len(p) for p in pairs)
        if budget == 1:  # at least one whole pair per feed (shorter than a chunk here)
            assert fed == [len(p) for p in pairs]
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    assert runner.memory().overhead > runner.rank_overhead() > 0  # counted once made


def test_what_is_not_a_reranker_is_refused(tmp_path: Path, reranker: Path) -> None:
    config = tiny_config("qwen3", vocab_size=TINY_VOCAB_SIZE)
    plain = load_model(write_gguf(tmp_path / "plain.gguf", config, weights_of(config)))
    assert not is_reranker(plain)
    with pytest.raises(UnsupportedModelError, match="not a reranker"):
        rerank_spec(plain)
    with pytest.raises(UnsupportedModelError, match="rerank"):
        embedding_spec(load_model(reranker))  # a reranker gives no embeddings
    with (
        open_session(str(plain.path), backend="llamacpp", slots=1, threads=1) as s,
        pytest.raises(UnsupportedModelError, match="no rank pooling"),
    ):
        s.engine.runner.start_rank([[5, 6, 7]])
    with pytest.raises(UnsupportedModelError, match="--backend llamacpp"):
        check_ranks(SimpleNamespace(info=SimpleNamespace(backend="torch")))


def weights_of(config) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    source = tiny_weights(config)
    return {name: source.get(name) for name in source.names()}


def test_a_context_smaller_than_a_pass_of_sequences(session: Session, reranker: Path) -> None:
    """At --ctx 16 the scoring (and embedding) contexts hold fewer cells than a pass may hold
    sequences: llama.cpp aborted the process there; short pairs score as at 1024."""
    pairs = [[5] * 10, [6] * 5, [7] * 3]
    wide = session.engine.embed(EmbeddingRequest(pairs, RANK)).result().vectors
    with open_session(str(reranker), backend="llamacpp", slots=1, ctx=16, threads=1) as small:
        narrow = small.engine.embed(EmbeddingRequest(pairs, RANK)).result().vectors
        vectors = small.engine.embed(EmbeddingRequest(pairs, "mean")).result().vectors
    np.testing.assert_allclose(narrow, wide, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
