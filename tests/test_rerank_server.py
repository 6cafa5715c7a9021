"""/v1/rerank and /rerank through a real server (httpx) on a tiny random reranker (issue #37):
scores equal llama.cpp's own (tests/rerank_reference.py) within 1e-4 and come sorted, top_n and
return_documents, usage; bad bodies are 400s naming the field, and so is a model that is no
reranker (naming it); the API key guards /rerank as it guards /v1; an answer generated beside a
rerank keeps its tokens."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from localinfer.server import ServerThread, create_app
from localinfer.session import Session, open_session
from tests.model_files import TINY_VOCAB_SIZE, write_gguf
from tests.rerank_model import write_tiny_reranker
from tests.rerank_reference import llama_cpp_rerank
from tests.tiny import tiny_config, tiny_weights

QUERY = "What is the capital of France?"
DOCS = ["The cat sat on the mat.", "Paris is the capital of France.", "  12 123, don't", "x"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_reranker(tmp_path_factory.mktemp("rerank") / "tiny-reranker.gguf")


@pytest.fixture(scope="module")
def session(reranker: Path) -> Iterator[Session]:
    with open_session(str(reranker), slots=2, ctx=1024, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def url(session: Session) -> Iterator[str]:
    with ServerThread(create_app(session)) as server:
        yield server.url


def post(url: str, path: str, body: dict, **kw: object) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120, **kw)  # type: ignore[arg-type]


def test_scores_are_llama_cpps_sorted(url: str, session: Session, reranker: Path) -> None:
    assert session.backend == "llamacpp"  # chosen for the reranker, not asked for
    pairs, expected = llama_cpp_rerank(reranker, QUERY, DOCS)
    answer = post(url, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "list" and body["model"] == "tiny-reranker"
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    got = np.array([0.0] * len(DOCS))
    for r in results:
        got[r["index"]] = r["relevance_score"]
    assert np.abs(got - expected).max() < 1e-4
    assert all("document" not in r for r in results)
    tokens = sum(len(p) for p in pairs)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_top_n_and_documents_on_both_paths(url: str) -> None:
    full = post(url, "/v1/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    for path in ("/v1/rerank", "/rerank"):
        body = {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}
        results = post(url, path, body).json()["results"]
        assert [r["index"] for r in results] == [r["index"] for r in full[:2]]
        assert [r["document"] for r in results] == [{"text": DOCS[r["index"]]} for r in full[:2]]
    many = post(url, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 99}).json()
    assert len(many["results"]) == len(DOCS)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
        ({"documents": DOCS}, "query"),
        ({"query": "", "documents": DOCS}, "query"),
        ({"query": QUERY, "documents": ["a", 3]}, "documents"),
        ({"query": QUERY, "documents": "a"}, "documents"),
        ({"query": QUERY, "documents": ["a", "long " * 900]}, "documents[1]"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(url: str, body: dict, param: str) -> None:
    answer = post(url, "/v1/rerank", body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"].startswith(param), error
    if param == "documents[1]":
        assert error["code"] == "context_length_exceeded"
        assert "1024" in error["message"] and "truncated" in error["message"]


def test_a_model_that_is_no_reranker_is_a_400(tmp_path: Path) -> None:
    config = tiny_config("qwen3", vocab_size=TINY_VOCAB_SIZE)
    source = tiny_weights(config)
    path = write_gguf(tmp_path / "plain.gguf", config, {n: source.get(n) for n in source.names()})
    with (
        open_session(str(path), backend="llamacpp", slots=1, threads=1) as s,
        ServerThread(create_app(s)) as server,
    ):
        answers = [
            post(server.url, path, {"query": QUERY, "documents": DOCS})
            for path in ("/rerank", "/v1/rerank")
        ]
    for answer in answers:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "model"
        assert error["code"] == "unsupported_model"
        assert "model 'plain' is not a reranker" in error["message"]


def test_the_api_key_guards_rerank(session: Session) -> None:
    with ServerThread(create_app(session, api_key="sesame")) as server:
        body = {"query": QUERY, "documents": DOCS[:1]}
        for path in ("/rerank", "/v1/rerank"):
            assert post(server.url, path, body).status_code == 401
            headers = {"Authorization": "Bearer sesame"}
            assert post(server.url, path, body, headers=headers).status_code == 200
        doc = httpx.get(server.url + "/openapi.json").json()["paths"]
    for path in ("/rerank", "/v1/rerank"):
        responses = doc[path]["post"]["responses"]
        assert {"200", "400", "401", "404"} <= set(responses)


def test_an_answer_beside_a_rerank_keeps_its_tokens(url: str) -> None:
    """The rerank runs between the engine's steps, in its own context: the answer streamed
    meanwhile is the answer given alone (greedy)."""
    ask = {"prompt": "Paris is", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    alone = post(url, "/v1/completions", ask).json()["choices"][0]["text"]
    ranks: list[dict] = []
    many = {"query": QUERY, "documents": DOCS * 8}
    worker = threading.Thread(target=lambda: ranks.append(post(url, "/rerank", many).json()))
    worker.start()
    beside = post(url, "/v1/completions", ask).json()["choices"][0]["text"]
    worker.join()
    assert beside == alone
    solo = post(url, "/rerank", many).json()
    assert ranks[0]["results"] == solo["results"]


def test_a_document_holding_a_lone_surrogate_comes_back_as_sent(url: str) -> None:
    """JSON lets a body spell a lone UTF-16 surrogate, which UTF-8 cannot encode: a document
    holding one, echoed with return_documents, is written as the escape it came as (it was a 500,
    Starlette's UTF-8 rendering of the answer raising)."""
    raw = '{"query": "q", "documents": ["\\ud800 x", "y"], "return_documents": true}'
    headers = {"Content-Type": "application/json"}
    answer = httpx.post(url + "/rerank", content=raw, headers=headers, timeout=120)
    assert answer.status_code == 200, answer.text
    assert {r["document"]["text"] for r in answer.json()["results"]} == {"\ud800 x", "y"}
