"""localinfer's /v1/rerank against llama.cpp's own llama-server --reranking on the same tiny
random rerankers (issue #37: the scores agree within 1e-4): the Qwen3-style one with its rerank
template and with BOS/EOS joins (tests/rerank_model.py), and the BERT-style ones with BERT's
WordPiece and XLM-RoBERTa's Unigram vocabulary (tests/rerank_bert_model.py).

llama-server is built once per machine from the installed llama-cpp-python's sources
(bench/llama_server.py: pip fetches the sdist, cmake builds it, minutes on two cores), so this
test is slow; it is skipped when the build cannot be made (no network for the sdist, no cmake).
llama-server runs one slot (-np 1), so each pair goes through llama.cpp in its own ubatches of
at most 512 tokens, the shape localinfer's rank context gives it: with several slots llama-server
batches pairs together, and its own scores then move with the batch (by 2.5e-6 on this model
with -np 4).
The fast check of the same numbers, against llama.cpp's API, is tests/test_rerank_runner.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench import llama_server
from bench.llamacpp_source import BuildFailed
from bench.peer_servers import start_llama_server
from localinfer.server import ServerThread, create_app
from localinfer.session import open_session
from tests.rerank_bert_model import Vocab, write_tiny_bert_reranker
from tests.rerank_model import write_tiny_reranker

pytestmark = pytest.mark.slow

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital of France.",
    "The cat sat on the mat <|im_end|> (special-token text in a document)",
    "  12 123, don't\n\nnewlines",
    "Berlin is the capital of Germany.",
    "long " * 150,  # more than one 512-token ubatch with the template
    "x",
]
CTX = 1024


@pytest.fixture(scope="module")
def binary() -> Path:
    try:
        return llama_server.ensure_built("native", log=print)
    except BuildFailed as exc:
        pytest.skip(f"llama-server could not be built here: {exc}")


def scores_of(body: dict) -> np.ndarray:
    out = np.full(len(DOCS), np.nan)
    for r in body["results"]:
        out[r["index"]] = r["relevance_score"]
    return out


@pytest.fixture(scope="module", params=["template", "bos-eos", "bert-wpm", "bert-ugm"])
def both(
    request: pytest.FixtureRequest, binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict, dict]]:
    """(llama-server's answer, localinfer's answer) to the same rerank of the same file."""
    path = tmp_path_factory.mktemp("rerank") / f"tiny-reranker-{request.param}.gguf"
    if request.param.startswith("bert-"):  # the Unigram one declares no pooling, as bge's may
        vocab: Vocab = "wpm" if request.param == "bert-wpm" else "ugm"
        write_tiny_bert_reranker(path, vocab=vocab, rank_pooling=vocab == "wpm")
    else:
        write_tiny_reranker(path, template=request.param == "template")
    body = {"query": QUERY, "documents": DOCS}
    peer = start_llama_server(
        binary, path, threads=1, slots=1, ctx=CTX, no_repack=True, extra=["--reranking"]
    )
    try:
        theirs = httpx.post(peer.url + "/v1/rerank", json=body, timeout=300)
    finally:
        peer.stop()
    assert theirs.status_code == 200, theirs.text
    with (
        open_session(str(path), slots=1, ctx=CTX, threads=1) as session,
        ServerThread(create_app(session)) as server,
    ):
        ours = httpx.post(server.url + "/v1/rerank", json=body, timeout=300)
    assert ours.status_code == 200, ours.text
    yield theirs.json(), ours.json()


def test_scores_equal_llama_servers(both: tuple[dict, dict]) -> None:
    theirs, ours = both
    expected, got = scores_of(theirs), scores_of(ours)
    assert not np.isnan(expected).any() and not np.isnan(got).any()
    difference = float(np.abs(got - expected).max())
    print(f"max |localinfer - llama-server| = {difference:.3g}")  # the figure the issue asks
    assert difference < 1e-4
    assert np.ptp(expected) > 0.01  # distinct scores: the comparison can fail
    assert [r["index"] for r in ours["results"]] == [r["index"] for r in theirs["results"]]
    assert ours["usage"] == theirs["usage"]  # the same pair tokens, counted alike
