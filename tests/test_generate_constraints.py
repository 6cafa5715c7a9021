"""`localinfer generate --json-schema/--regex/--json-object` through cli.main on the embedded
model: answers follow the constraint, and bad constraints are one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localinfer.cli import main

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
FAST = ["--threads", "1", "--ctx", "512", "--max-tokens", "80"]


def generate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    rc = main(["generate", *argv, *FAST, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_json_schema_from_a_file_and_inline(capsys, tmp_path: Path) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    for source in (str(path), json.dumps(SCHEMA)):
        doc = generate_json(capsys, "Where is the Eiffel tower?", "--json-schema", source)
        jsonschema.validate(json.loads(doc["text"]), SCHEMA)
        assert doc["finish_reason"] == "stop"


def test_regex_streams_a_matching_answer(capsys) -> None:
    rc = main(["generate", "Is the sky blue?", "--regex", r"(Yes|No), [a-z ]{1,30}\.", *FAST])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.fullmatch(r"(Yes|No), [a-z ]{1,30}\.", out.rstrip("\n")), out
    assert "finish: stop" in err


def test_json_object_with_sampling(capsys) -> None:
    doc = generate_json(
        capsys,
        "Give me a JSON object describing a cat with name and age.",
        "--json-object",
        "--temperature",
        "0.7",
        "--seed",
        "1",
    )
    assert isinstance(json.loads(doc["text"]), dict)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--json-schema", '{"type": "frobnicate"}'], "--json-schema: Invalid type: frobnicate"),
        (["--json-schema", "{not json"], "--json-schema: the JSON schema is not valid JSON"),
        (
            ["--json-schema", "no/such/schema.json"],
            "--json-schema: 'no/such/schema.json' is neither a file",
        ),
        (
            ["--regex", "(ab"],
            '--regex: invalid regex "(ab" (in regex): regex parse error: unclosed group',
        ),
    ],
)
def test_bad_constraints_are_one_line_errors(capsys, argv: list[str], words: str) -> None:
    assert main(["generate", "hi", *argv, *FAST]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"localinfer: error: {words}") and err.count("\n") == 1, err
    assert out == ""


def test_constraint_options_exclude_each_other(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hi", "--regex", "a", "--json-object"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
