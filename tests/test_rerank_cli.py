"""`localinfer rerank` (issue #37) on a tiny random reranker, in this process: the table, best
first, with llama.cpp's own scores (tests/rerank_reference.py); --json as /v1/rerank answers;
--top-n; what is refused, as one line and exit status 1. And `localinfer budget` on it: a
reranker, on llama.cpp, its scoring context counted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localinfer.backend_budget import compute_budget
from localinfer.budget.report import BudgetRequest
from localinfer.cli import main
from localinfer.commands.rerank import preview
from tests.model_files import TINY_VOCAB_SIZE, write_gguf
from tests.rerank_model import write_tiny_reranker
from tests.rerank_reference import llama_cpp_rerank
from tests.tiny import tiny_config, tiny_weights

QUERY = "What is the capital of France?"
DOCS = ["The cat sat on the mat.", "Paris is the capital of France.", "  12 123, don't"]
FAST = ["--threads", "1", "--ctx", "1024"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_reranker(tmp_path_factory.mktemp("rerank") / "tiny-reranker.gguf")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["rerank", *argv, *FAST])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_ranks_by_llama_cpps_scores(
    capsys: pytest.CaptureFixture[str], reranker: Path
) -> None:
    pairs, expected = llama_cpp_rerank(reranker, QUERY, DOCS)
    code, out, err = run(capsys, "-m", str(reranker), QUERY, *DOCS)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["rank", "score", "index", "document"]
    cells = [row.split(maxsplit=3) for row in rows]
    assert [int(c[0]) for c in cells] == [1, 2, 3]
    order = [int(c[2]) for c in cells]
    assert order == list(np.argsort(-expected, kind="stable"))
    for c in cells:
        assert float(c[1]) == pytest.approx(expected[int(c[2])], abs=1e-4)
        assert c[3] == preview(DOCS[int(c[2])])
    assert f"llamacpp · yes score (yes, no head) · 3 documents · {sum(map(len, pairs))}" in err


def test_json_and_top_n(capsys: pytest.CaptureFixture[str], reranker: Path) -> None:
    _, expected = llama_cpp_rerank(reranker, QUERY, DOCS)
    code, out, err = run(capsys, "-m", str(reranker), "--json", "--top-n", "2", QUERY, *DOCS)
    assert code == 0, err
    body = json.loads(out)
    best = list(np.argsort(-expected, kind="stable"))[:2]
    assert [r["index"] for r in body["results"]] == best
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-4)
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0


def test_refusals_are_one_line(
    capsys: pytest.CaptureFixture[str], reranker: Path, tmp_path: Path
) -> None:
    code, _, err = run(capsys, "-m", str(reranker), "--top-n", "0", QUERY, *DOCS)
    assert code == 1 and "--top-n must be at least 1" in err
    code, _, err = run(capsys, "-m", str(reranker), QUERY, "long " * 900)
    assert code == 1 and "documents[0] with the query" in err and "1024" in err
    config = tiny_config("qwen3", vocab_size=TINY_VOCAB_SIZE, max_ctx=2048)
    source = tiny_weights(config)
    plain = write_gguf(tmp_path / "plain.gguf", config, {n: source.get(n) for n in source.names()})
    code, _, err = run(capsys, "-m", str(plain), QUERY, *DOCS)
    assert code == 1 and "model 'plain' is not a reranker" in err
    assert len(err.strip().splitlines()) == 1  # no traceback


def test_the_budget_knows_a_reranker(reranker: Path) -> None:
    report = compute_budget(BudgetRequest(str(reranker), ctx=1024, device="8GiB"))
    assert report.reranker and report.backend == "llamacpp"
    asked = compute_budget(BudgetRequest(str(reranker), ctx=1024, device="8GiB", backend="torch"))
    assert asked.backend == "torch"  # a backend asked for is kept
    # The scoring context's cells: one more sequence's worth of KV beside the slots'.
    two_slots = compute_budget(
        BudgetRequest(str(reranker), ctx=1024, concurrency=2, device="8GiB")
    ).kv_cache_bytes
    assert report.kv_cache_bytes * 3 == two_slots * 2  # 1 + 1 sequences against 2 + 1
