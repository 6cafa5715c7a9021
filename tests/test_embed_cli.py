"""`localinfer embed`: JSON lines of unit vectors, the cosine table, stdin, and its errors as one
line and exit status 1 (the embedded model, in this process)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from localinfer.cli import build_parser, main
from localinfer.commands.embed import read_texts, similarity_table
from localinfer.errors import InvalidParameterError

FAST = ["--threads", "1", "--ctx", "256"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["embed", *argv, *FAST])
    out, err = capsys.readouterr()
    return code, out, err


def test_vectors_as_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "The cat sat on the mat.", "A dog lay on the rug.")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["index"], x["text"]) for x in lines] == [
        (0, "The cat sat on the mat."),
        (1, "A dog lay on the rug."),
    ]
    vectors = np.array([x["embedding"] for x in lines])
    assert vectors.shape == (2, 576)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert "mean pooling (the default: the model declares none) · 576 dimensions" in err


def test_similarity_table_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["The cat sat on the mat.", "", "A dog lay on the rug.", "Stock markets fell today."]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(texts) + "\n"))
    code, out, err = run(capsys, "--similarity")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["[0]", "[1]", "[2]"]  # the blank line is skipped
    assert rows[0].startswith("[0] The cat sat on the mat.")
    table = np.array([[float(x) for x in row.split()[-3:]] for row in rows])
    np.testing.assert_allclose(np.diag(table), 1.0, atol=1e-3)
    np.testing.assert_allclose(table, table.T)
    assert table[0, 1] > table[0, 2]  # the animals are nearer each other than the markets


def test_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "x", "--dimensions", "577")
    assert code == 1
    assert err.strip().startswith("localinfer: error: --dimensions: 577 is more than the 576")
    monkeypatch.setattr("sys.stdin", Terminal())
    code, _, err = run(capsys)
    assert code == 1 and "TEXT: give texts to embed" in err


def test_read_texts() -> None:
    assert read_texts(["a", "b"], Terminal()) == ["a", "b"]
    assert read_texts([], io.StringIO("one\r\n\n  \ntwo")) == ["one", "two"]
    with pytest.raises(InvalidParameterError, match="TEXT: text 2 is empty"):
        read_texts(["a", ""], Terminal())
    with pytest.raises(InvalidParameterError, match="stdin held no text"):
        read_texts([], io.StringIO("\n\n"))


def test_similarity_table_layout() -> None:
    vectors = np.array([[1.0, 0.0], [0.6, 0.8]])
    table = similarity_table(["short", "a text longer than the label width allows"], vectors)
    assert table.splitlines() == [
        "                                     [0]     [1]",
        "[0] short                          1.000   0.600",
        "[1] a text longer than the labe…   0.600   1.000",
    ]


def test_registered_with_its_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    embed = sub.choices["embed"]
    assert "cosine" in embed.description
    args = embed.parse_args(["a", "b", "--similarity", "-m", "smollm2-135m"])
    assert (args.texts, args.similarity, args.model) == (["a", "b"], True, "smollm2-135m")
