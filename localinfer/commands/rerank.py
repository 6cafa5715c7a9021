"""`localinfer rerank QUERY DOC...`: documents ranked by a reranker's relevance to a query.

The table (or ``--json``, the body /v1/rerank answers) lists the documents by score, highest
first: each (query, document) pair formatted as llama-server formats it and scored by the model's
head (loading/rerank_spec.py) through the engine, as the server scores it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from localinfer.command_help import command_parser
from localinfer.errors import InvalidParameterError
from localinfer.model_options import add_model_options, model_settings

PREVIEW = 60  # characters of each document shown in the table


def register(subparsers: Any) -> None:
    p = command_parser(subparsers, "rerank", run)
    p.add_argument("query", metavar="QUERY", help="what the documents are ranked against")
    p.add_argument("documents", nargs="+", metavar="DOC", help="documents to rank")
    p.add_argument("-m", "--model", metavar="MODEL", help="a reranker GGUF (rank pooling)")
    p.add_argument("--top-n", type=int, metavar="N", help="show the N best (default: all)")
    p.add_argument("--json", action="store_true", help="print /v1/rerank's response body")
    add_model_options(p)


def run(args: argparse.Namespace) -> int:
    if args.top_n is not None and args.top_n < 1:
        raise InvalidParameterError(f"--top-n must be at least 1, got {args.top_n}")
    if not args.query:
        raise InvalidParameterError("QUERY: empty")
    from localinfer.engine import EmbeddingRequest
    from localinfer.engine.embedding import check_ranks
    from localinfer.facts.pooling import RANK
    from localinfer.loading.rerank_spec import pairs_ids, ranked, rerank_spec
    from localinfer.session import open_session

    # A rerank takes no generation slot: one is enough for the engine.
    with open_session(args.model, slots=1, **model_settings(args)) as session:
        spec = rerank_spec(session.model)  # before any compute: is this a reranker?
        check_ranks(session.engine.runner)
        engine = session.engine
        ids = pairs_ids(session.tokenizer, spec, args.query, args.documents, engine.max_ctx)
        result = engine.embed(EmbeddingRequest(ids, RANK)).result()
        scores = [float(s) for s in result.vectors[:, 0]]
        order = ranked(scores, args.top_n)
        if args.json:
            print(json.dumps(json_body(session.model.name, scores, order, args.documents,
                                       result.prompt_tokens), ensure_ascii=False))  # fmt: skip
        else:
            print(table(scores, order, args.documents))
        print(
            f"{session.backend} · {spec.labels[0]} score ({', '.join(spec.labels)} head) · "
            f"{len(args.documents)} documents · {result.prompt_tokens} tokens",
            file=sys.stderr,
        )
    return 0


def table(scores: Sequence[float], order: Sequence[int], documents: Sequence[str]) -> str:
    """rank, score, index and a one-line preview of each document, best first."""
    lines = [f"{'rank':>4}  {'score':>9}  {'index':>5}  document"]
    for rank, i in enumerate(order, start=1):
        lines.append(f"{rank:>4}  {scores[i]:>9.4f}  {i:>5}  {preview(documents[i])}")
    return "\n".join(lines)


def preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


def json_body(
    model: str, scores: Sequence[float], order: Sequence[int], documents: Sequence[str], tokens: int
) -> dict[str, Any]:
    results = [
        {"index": i, "relevance_score": scores[i], "document": {"text": documents[i]}}
        for i in order
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"model": model, "object": "list", "usage": usage, "results": results}
