"""Constrained decoding (localinfer.constraints) on the embedded model's real tokenizer.

Greedy-style walks: at each step the allowed token with the highest score wins, so every answer is
whatever the constraint lets through; each must parse as JSON and validate against its schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from localinfer.constraints import (  # noqa: E402
    ConstraintCompiler,
    ConstraintSpec,
    TokenConstraint,
    TokenRefusedError,
    allocate_bitmask,
    apply_bitmask,
    bitmask_to_bool,
    vocabulary_from_tokenizer,
)
from localinfer.errors import InvalidParameterError  # noqa: E402

MAX_STEPS = 400
WARM_UP = 6  # steps of free choice before the walk leans towards closing what it opened
FREE_TEXT = 1000  # more allowed tokens than this: inside a string


def obj(**properties: Any) -> dict[str, Any]:
    """OpenAI's strict form: every property required, no others."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


STR, INT, NUM, BOOL, NULL = (
    {"type": t} for t in ("string", "integer", "number", "boolean", "null")
)
ITEM = obj(id=INT, label=STR)
SCHEMAS: dict[str, dict[str, Any]] = {
    "string": obj(name=STR),
    "integer": obj(count=INT),
    "number": obj(ratio=NUM),
    "boolean": obj(ok=BOOL),
    "null": obj(nothing=NULL),
    "flat": obj(name=STR, age=INT, score=NUM, active=BOOL),
    "string-enum": obj(color={"type": "string", "enum": ["red", "green", "blue"]}),
    "int-enum": obj(level={"enum": [1, 2, 3]}),
    "const": obj(kind={"const": "event"}, n=INT),
    "string-array": obj(tags={"type": "array", "items": STR}),
    "number-array": obj(values={"type": "array", "items": NUM}),
    "bounded-array": obj(pair={"type": "array", "items": INT, "minItems": 2, "maxItems": 2}),
    "object-array": obj(items={"type": "array", "items": ITEM}),
    "nested": obj(user=obj(name=STR, address=obj(city=STR, zip=STR))),
    "deep": obj(a=obj(b=obj(c=obj(d=INT)))),
    "anyOf-scalar": obj(value={"anyOf": [STR, INT, NULL]}),
    "anyOf-objects": obj(result={"anyOf": [obj(value=NUM), obj(error=STR)]}),
    "nullable-type": obj(lat={"type": ["number", "null"]}),
    "date-time": obj(when={"type": "string", "format": "date-time"}),
    "date": obj(day={"type": "string", "format": "date"}),
    "email": obj(to={"type": "string", "format": "email"}),
    "uuid": obj(id={"type": "string", "format": "uuid"}),
    "string-length": obj(code={"type": "string", "minLength": 3, "maxLength": 5}),
    "int-range": obj(percent={"type": "integer", "minimum": 0, "maximum": 100}),
    "pattern": obj(phone={"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}),
    "defs-ref": {
        **obj(items={"type": "array", "items": {"$ref": "#/$defs/item"}}),
        "$defs": {"item": ITEM},
    },  # fmt: skip
    "recursive": {
        **obj(root={"$ref": "#/$defs/node"}),
        "$defs": {
            "node": obj(name=STR, children={"type": "array", "items": {"$ref": "#/$defs/node"}})
        },
    },  # fmt: skip
    "optional-fields": {"type": "object", "properties": {"a": INT, "b": STR}, "required": ["a"]},
    "tool-call": obj(
        location=STR,
        unit={"type": "string", "enum": ["celsius", "fahrenheit"]},
        days=INT,
        fields={"type": "array", "items": {"enum": ["temp", "wind", "rain"]}},
    ),
}


@pytest.fixture(scope="module")
def tokenizer():
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    return load_model(embedded_model_path()).tokenizer


@pytest.fixture(scope="module")
def compiler(tokenizer) -> ConstraintCompiler:
    return ConstraintCompiler(vocabulary_from_tokenizer(tokenizer))


@pytest.fixture(scope="module")
def leanings(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Weights by token for ending what a walk opened: inside a string, a closing quote (alone
    or followed by closing brackets), then '@' and '.' so an email address can end; elsewhere,
    tokens of closing brackets only, and EOS."""
    pieces = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
    in_string = np.array([
        3.0 * bool(re.fullmatch(rb'"[\]}]*', p)) + 2.0 * (p == b"@") + 1.0 * (p == b".")
        for p in pieces
    ])  # fmt: skip
    closing = np.array([float(bool(re.fullmatch(rb"[\]}]+", p))) for p in pieces])
    closing[list(tokenizer.eos_ids)] = 1.0
    return in_string, closing


def greedy_walk(
    constraint: TokenConstraint, scores: np.ndarray, leanings: tuple[np.ndarray, np.ndarray]
) -> list[int]:
    """Pick the best allowed token until the constraint finishes. ``scores`` is fixed; past the
    warm-up, a growing bonus goes to the leanings (inside a string: most of the vocabulary is
    allowed there), so every walk ends."""
    in_string, closing = leanings
    taken: list[int] = []
    for step in range(MAX_STEPS):
        if constraint.is_finished():
            return taken
        allowed = constraint.allowed_bool()
        lean = in_string if allowed.sum() > FREE_TEXT else closing
        bonus = 0.2 * max(0, step - WARM_UP) * lean
        token = int(np.argmax(np.where(allowed, scores + bonus, -np.inf)))
        constraint.advance(token)
        taken.append(token)
    raise AssertionError(f"no end after {MAX_STEPS} tokens")


def answer_text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode([i for i in ids if i not in tokenizer.eos_ids])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_greedy_walk_answers_validate(name, tokenizer, compiler, leanings) -> None:
    schema = SCHEMAS[name]
    scores = np.random.default_rng(list(SCHEMAS).index(name)).random(tokenizer.vocab_size)
    ids = greedy_walk(
        compiler.compile(ConstraintSpec("json_schema", schema)).start(), scores, leanings
    )
    text = answer_text(tokenizer, ids)
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_json_object_gives_an_object(tokenizer, compiler, leanings) -> None:
    scores = np.random.default_rng(7).random(tokenizer.vocab_size)
    ids = greedy_walk(compiler.compile(ConstraintSpec("json_object")).start(), scores, leanings)
    assert isinstance(json.loads(answer_text(tokenizer, ids)), dict)


def test_regex(tokenizer, compiler, leanings) -> None:
    spec = ConstraintSpec("regex", r"(yes|no), [0-9]{3}-[0-9]{4}")
    for seed in range(3):
        scores = np.random.default_rng(seed).random(tokenizer.vocab_size)
        text = answer_text(tokenizer, greedy_walk(compiler.compile(spec).start(), scores, leanings))
        assert re.fullmatch(r"(yes|no), [0-9]{3}-[0-9]{4}", text), text


@pytest.mark.parametrize("grammar", ['start: "yes" | "no"', 'root ::= "yes" | "no"'])
def test_grammar_lark_and_gbnf(grammar, tokenizer, compiler, leanings) -> None:
    scores = np.random.default_rng(3).random(tokenizer.vocab_size)
    walk = greedy_walk(
        compiler.compile(ConstraintSpec("grammar", grammar)).start(), scores, leanings
    )
    assert answer_text(tokenizer, walk) in ("yes", "no")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (lambda: ConstraintSpec("json_schema", {"type": "frobnicate"}), "frobnicate"),
        (
            lambda: ConstraintSpec("json_schema", obj(a={"type": "string", "pattern": "(x"})),
            "regex parse error: unclosed group",
        ),
        (lambda: ConstraintSpec("json_schema", "{not json"), "not valid JSON"),
        (lambda: ConstraintSpec("json_schema", "[1, 2]"), "must be an object"),
        (lambda: ConstraintSpec("regex", "(ab"), 'invalid regex "(ab"'),
        (lambda: ConstraintSpec("regex", "[z-a]"), "invalid character class range"),
        (lambda: ConstraintSpec("grammar", "start: missing_rule"), "missing_rule"),
        (lambda: ConstraintSpec("xml", "x"), "unknown constraint kind"),  # type: ignore[arg-type]
        (
            lambda: ConstraintSpec(
                "json_schema", {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
            ),
            "admits no answer",  # it gave an empty answer ending with "stop"
        ),
    ],
)
def test_invalid_sources_name_the_problem(spec, words, compiler) -> None:
    with pytest.raises(InvalidParameterError, match=re.escape(words)) as caught:
        compiler.compile(spec())
    assert caught.value.http_status == 400
    assert str(caught.value).startswith("response_format: ")


def test_constrained_greedy_equals_unconstrained_when_already_valid(tokenizer, compiler) -> None:
    """Scores whose argmax at every step spells a valid answer: the constraint changes nothing."""
    answer = json.dumps({"location": "Paris", "unit": "celsius", "days": 3, "fields": ["rain"]})
    target = [*tokenizer.encode(answer, parse_special=False), tokenizer.eos_ids[0]]
    rng = np.random.default_rng(11)
    constraint = compiler.compile(ConstraintSpec("json_schema", SCHEMAS["tool-call"])).start()
    picked = []
    for token in target:
        scores = rng.random(tokenizer.vocab_size)
        scores[token] = 2.0  # the unconstrained greedy choice
        allowed = constraint.allowed_bool()
        choice = int(np.argmax(np.where(allowed, scores, -np.inf)))
        constraint.advance(choice)
        picked.append(choice)
    assert picked == target
    assert constraint.is_finished()
    assert picked[-1] in tokenizer.eos_ids


def test_refused_token_raises_and_rollback_restores(tokenizer, compiler) -> None:
    constraint = compiler.compile(ConstraintSpec("json_schema", obj(n=INT))).start()
    prefix = tokenizer.encode('{"n": 4', parse_special=False)
    assert constraint.accepted_prefix([*prefix, *tokenizer.encode("x")]) == len(prefix)
    for token in prefix:
        constraint.advance(token)
    before = constraint.allowed().copy()
    close = tokenizer.encode("}", parse_special=False)
    constraint.advance(close[0])
    assert constraint.is_complete()
    constraint.rollback(1)
    assert np.array_equal(constraint.allowed(), before)
    with pytest.raises(TokenRefusedError):
        constraint.advance(tokenizer.encode("abc", parse_special=False)[0])


def test_special_tokens_never_spelled_inside_strings(tokenizer, compiler) -> None:
    constraint = compiler.compile(ConstraintSpec("json_schema", obj(s=STR))).start()
    for token in tokenizer.encode('{"s": "', parse_special=False):
        constraint.advance(token)
    allowed = constraint.allowed_bool()
    assert not allowed[sorted(tokenizer.special_ids)].any()
    assert allowed.sum() > 40_000  # free text: nearly the whole vocabulary


def test_bitmask_helpers_and_padded_logits(tokenizer) -> None:
    vocabulary = vocabulary_from_tokenizer(tokenizer, logits_size=tokenizer.vocab_size + 64)
    constraint = ConstraintCompiler(vocabulary).compile(ConstraintSpec("regex", "a")).start()
    rows = allocate_bitmask(2, vocabulary.size)
    constraint.fill_allowed(rows[1])
    assert bitmask_to_bool(rows[0], vocabulary.size).all()  # an untouched row allows all
    allowed = np.flatnonzero(bitmask_to_bool(rows[1], vocabulary.size))
    assert [tokenizer.token_bytes(int(i)) for i in allowed] == [b"a"]
    logits = np.zeros((2, vocabulary.size), dtype=np.float32)
    apply_bitmask(logits, rows)
    assert np.isfinite(logits[0]).all()
    assert np.flatnonzero(np.isfinite(logits[1])).tolist() == allowed.tolist()
