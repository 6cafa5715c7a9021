"""`localinfer embed [TEXT ...]`: embedding vectors as JSON lines, or a cosine-similarity table.

With no TEXT, each non-empty line of stdin is one text. Vectors are unit length, pooled as the
model declares (localinfer/loading/embedding_spec.py), so a dot product is a cosine.
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

LABEL_WIDTH = 28  # characters of each text shown in the similarity table


def register(subparsers: Any) -> None:
    p = command_parser(subparsers, "embed", run)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed (default: stdin lines)")
    p.add_argument("-m", "--model", metavar="MODEL", help="default: smollm2-135m (embedded)")
    p.add_argument(
        "--similarity",
        action="store_true",
        help="print the cosine similarity of every pair of texts instead of the vectors",
    )
    p.add_argument(
        "--dimensions",
        type=int,
        help="keep the first N components of each vector, renormalised (N up to the model's width)",
    )
    add_model_options(p)


def read_texts(given: Sequence[str], stdin: Any) -> list[str]:
    """The TEXT arguments, else stdin's non-empty lines; an error when there are none."""
    if given:
        texts = list(given)
    elif stdin.isatty():
        raise InvalidParameterError("TEXT: give texts to embed, or pipe them in one per line")
    else:
        texts = [line.rstrip("\r\n") for line in stdin]
        texts = [t for t in texts if t.strip()]
    empty = next((i for i, t in enumerate(texts) if not t), None)
    if empty is not None:
        raise InvalidParameterError(f"TEXT: text {empty + 1} is empty")
    if not texts:
        raise InvalidParameterError("TEXT: stdin held no text to embed")
    return texts


def run(args: argparse.Namespace) -> int:
    texts = read_texts(args.texts, sys.stdin)
    from localinfer.session import open_session

    # Embeddings take no slot: one is enough for the engine.
    with open_session(args.model, slots=1, **model_settings(args)) as session:
        # Checked before any compute, with the option's own name.
        session.embedding_spec.check_dimensions(args.dimensions, field="--dimensions")
        result = session.embed(texts, dimensions=args.dimensions)
        if args.similarity:
            print(similarity_table(texts, result.vectors))
        else:
            for i, (text, vector) in enumerate(zip(texts, result.vectors, strict=True)):
                line = {"index": i, "text": text, "embedding": vector.tolist()}
                print(json.dumps(line, ensure_ascii=False))
        spec = session.embedding_spec
        print(
            f"{session.backend} · {spec.pooling} pooling ({spec.pooling_source}) · "
            f"{result.vectors.shape[1]} dimensions · {result.prompt_tokens} tokens",
            file=sys.stderr,
        )
    return 0


def similarity_table(texts: Sequence[str], vectors: Any) -> str:
    """Cosines of every pair (``vectors`` are unit rows), rows labelled by the texts."""
    cosines = vectors @ vectors.T  # [n, n]
    labels = [_label(i, t) for i, t in enumerate(texts)]
    width = max(len(label) for label in labels)
    header = " " * width + "".join(f"{f'[{j}]':>8}" for j in range(len(texts)))
    rows = [
        label.ljust(width) + "".join(f"{c:8.3f}" for c in row)
        for label, row in zip(labels, cosines, strict=True)
    ]
    return "\n".join([header, *rows])


def _label(index: int, text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > LABEL_WIDTH:
        flat = flat[: LABEL_WIDTH - 1] + "…"
    return f"[{index}] {flat}"
