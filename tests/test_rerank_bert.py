"""BERT-style rerankers (bge-reranker) on the llama.cpp runner (issue #37), on tiny random ones
(tests/rerank_bert_model.py): BERT's WordPiece with rank pooling declared, and XLM-RoBERTa's
Unigram with none (a classifier head is what makes it a reranker). Their vocabularies are
tokenized by llama.cpp, pairs are formatted as llama-server formats them, and /v1/rerank and
`localinfer rerank` give llama.cpp's own scores (tests/rerank_reference.py) within 1e-4; the
budget counts no KV cache; what cannot be done is refused. The comparison with llama-server
itself is tests/test_rerank_llama_server.py (slow)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from localinfer.backend_budget import compute_budget
from localinfer.budget.report import BudgetRequest
from localinfer.cli import main
from localinfer.engine.embedding import EmbeddingError, EmbeddingRequest
from localinfer.errors import BackendUnavailableError, ModelFileError, UnsupportedModelError
from localinfer.facts.pooling import RANK
from localinfer.loading.embedding_spec import embedding_spec
from localinfer.loading.loader import load_model
from localinfer.loading.rerank_spec import is_reranker, pair_ids, rerank_spec
from localinfer.server import ServerThread, create_app
from localinfer.session import Session, open_session
from tests.rerank_bert_model import write_tiny_bert_reranker
from tests.rerank_reference import llama_cpp_rerank

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital of France.",
    "The cat sat on the mat [SEP] </s> (special-token text in a document)",
    "  12 123, don't\n\nnewlines",
    "Ünïcödé 東京 ☃",
    "long " * 150,
    "x",
]
CTX = ["--threads", "1", "--ctx", "1024"]


@pytest.fixture(scope="module", params=["wpm", "ugm"], ids=["wordpiece", "unigram-head-only"])
def reranker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rerank") / f"tiny-bert-{request.param}.gguf"
    return write_tiny_bert_reranker(path, vocab=request.param, rank_pooling=request.param == "wpm")


@pytest.fixture(scope="module")
def session(reranker: Path) -> Iterator[Session]:
    with open_session(str(reranker), slots=1, ctx=1024, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def url(session: Session) -> Iterator[str]:
    with ServerThread(create_app(session)) as server:
        yield server.url


def scores_of(results: list[dict]) -> np.ndarray:
    out = np.full(len(DOCS), np.nan)
    for r in results:
        out[r["index"]] = r["relevance_score"]
    return out


def test_pairs_are_llama_cpps_tokens(reranker: Path, session: Session) -> None:
    assert session.backend == "llamacpp"  # chosen for the reranker, not asked for
    spec = rerank_spec(session.model)
    assert is_reranker(session.model) and spec.labels == ("LABEL_0",)
    expected, _ = llama_cpp_rerank(reranker, QUERY, DOCS)
    mine = [pair_ids(session.tokenizer, spec, QUERY, d) for d in DOCS]
    assert mine == expected
    q, d = (session.tokenizer.encode(t, parse_special=False) for t in (QUERY, DOCS[0]))
    if "wpm" in reranker.name:  # [CLS] query [SEP] document [SEP]
        assert mine[0] == [2, *q, 3, *d, 3]
    else:  # <s> query </s> </s> document </s>
        assert mine[0] == [0, *q, 2, 2, *d, 2]


def test_v1_rerank_gives_llama_cpps_scores(url: str, reranker: Path) -> None:
    pairs, expected = llama_cpp_rerank(reranker, QUERY, DOCS)
    answer = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=120)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    got = scores_of(body["results"])
    assert np.abs(got - expected).max() < 1e-4
    assert np.ptp(expected) > 0.01  # distinct scores: the comparison can fail
    assert [r["index"] for r in body["results"]] == list(np.argsort(-expected, kind="stable"))
    tokens = sum(len(p) for p in pairs)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_a_pair_longer_than_one_ubatch_is_a_400(url: str) -> None:
    """An encoder scores a pair whole, in one 512-token ubatch, as llama-server does by default,
    though the context holds 1024."""
    body = {"query": QUERY, "documents": ["x", "long " * 600]}
    answer = httpx.post(url + "/rerank", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "documents[1]" and error["code"] == "context_length_exceeded"
    assert "one ubatch of 512" in error["message"]


def test_the_cli_and_the_budget(capsys: pytest.CaptureFixture[str], reranker: Path) -> None:
    _, expected = llama_cpp_rerank(reranker, QUERY, DOCS)
    code = main(["rerank", "-m", str(reranker), *CTX, QUERY, *DOCS])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [row.split(maxsplit=3) for row in out.splitlines()[1:]]
    assert [int(r[2]) for r in rows] == list(np.argsort(-expected, kind="stable"))
    for r in rows:
        assert float(r[1]) == pytest.approx(expected[int(r[2])], abs=1e-4)
    assert "llamacpp · LABEL_0 score" in err
    report = compute_budget(BudgetRequest(str(reranker), ctx=1024, device="8GiB"))
    assert report.reranker and report.encoder and report.backend == "llamacpp"
    assert report.kv_cache_bytes == 0  # llama.cpp keeps no KV for an encoder


def test_what_cannot_be_done_is_refused(reranker: Path, tmp_path: Path) -> None:
    model = load_model(reranker)
    assert model.config.arch == "bert" and is_reranker(model)
    with pytest.raises(UnsupportedModelError, match="--backend llamacpp"):
        model.tokenizer.encode(QUERY)  # no llama.cpp runner has lent its tokenizer
    with pytest.raises(UnsupportedModelError, match="BERT encoder gives no embeddings"):
        embedding_spec(model)
    with open_session(str(reranker), slots=1, ctx=1024, threads=1) as s:
        assert s.tokenizer.encode("x")
    with pytest.raises(BackendUnavailableError, match="closed"):
        s.tokenizer.encode("x")  # its runner's model is freed
    broken = write_tiny_bert_reranker(tmp_path / "broken.gguf", leave_out={"blk.1.ffn_up.weight"})
    with pytest.raises(ModelFileError, match="missing tensor 'blk.1.ffn_up.weight'"):
        load_model(broken)


def test_a_pair_over_one_ubatch_fails_alone(session: Session) -> None:
    """Below the server's check, the runner refuses an encoder's pair longer than its ubatch, and
    the next rerank still runs (the refused pass never took the scoring context)."""
    with pytest.raises(EmbeddingError, match="one ubatch of 512"):
        session.engine.embed(EmbeddingRequest([[5] * 600], RANK)).result()
    scores = session.engine.embed(EmbeddingRequest([[2, 5, 3], [2, 6, 3]], RANK)).result()
    assert scores.vectors.shape == (2, 1) and np.isfinite(scores.vectors).all()


def test_an_encoder_writes_no_text(url: str) -> None:
    """A completion asked of a BERT reranker is refused (unsupported_model, naming rerank), not
    answered with tokens from a model that has no LM head."""
    r = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_model"
    assert "generates no text" in error["message"] and "/v1/rerank" in error["message"]
    r = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS[:2]}, timeout=60)
    assert r.status_code == 200  # the reranker still serves what it can
