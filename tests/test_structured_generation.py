"""Constrained decoding on the embedded SmolLM2-135M through Session and Engine: answers to JSON
schemas validate (jsonschema), regexes match under seeded sampling, greedy constrained answers
equal the free ones where those already fit (logprobs included: the model's own distribution),
and Session.compile_constraint's errors and threads."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from bench.structured_cases import CASES, prompt_text  # noqa: E402
from localinfer.constraints import ConstraintSpec  # noqa: E402
from localinfer.engine import Request, SamplingParams  # noqa: E402
from localinfer.errors import InvalidParameterError  # noqa: E402
from localinfer.session import Session, open_session  # noqa: E402

MAX_TOKENS = 200


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    # The torch runner: batch-invariant logits (tests/test_server_support.make_session says why);
    # one backend thread: on a shared CPU that is faster than several waiting on each other.
    s = open_session(None, backend="torch", slots=4, ctx=1024, threads=1)
    yield s
    s.close()


def ask(session: Session, question: str, schema: dict[str, Any] | None = None) -> list[int]:
    content = question if schema is None else prompt_text(question, schema)
    return session.chat_prompt_ids([{"role": "user", "content": content}])


def test_answers_to_json_schemas_all_validate(session: Session) -> None:
    assert len(CASES) >= 20
    requests = [
        Request(
            ask(session, question, schema),
            SamplingParams(max_tokens=MAX_TOKENS),
            constraint=session.compile_constraint(ConstraintSpec("json_schema", schema)),
        )
        for question, schema in CASES.values()
    ]
    # All at once: four slots decode side by side, the rest wait for one.
    handles = session.engine.submit_all(requests)
    results = {name: h.result() for name, h in zip(CASES, handles, strict=True)}
    checker = jsonschema.FormatChecker()
    for name, result in results.items():
        assert result.finish_reason == "stop", (name, result.text)
        schema = CASES[name][1]
        jsonschema.validate(json.loads(result.text), schema, format_checker=checker)


def test_json_object_answers_are_objects(session: Session) -> None:
    constraint = session.compile_constraint(ConstraintSpec("json_object"))
    result = session.engine.generate(
        Request(
            ask(session, "Give me a JSON object describing a cat with name and age."),
            SamplingParams(max_tokens=MAX_TOKENS),
            constraint=constraint,
        )  # fmt: skip
    )
    assert result.finish_reason == "stop"
    assert isinstance(json.loads(result.text), dict)


def regex_literal(text: str) -> str:
    """``text`` as a regex matching itself (Rust syntax: escape only metacharacters)."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in text)


def free_and_constrained(session: Session, prompt: list[int], spec: ConstraintSpec):
    params = SamplingParams(max_tokens=60, logprobs=2)
    free = session.engine.generate(Request(prompt, params))
    constraint = session.compile_constraint(spec)
    return free, session.engine.generate(Request(prompt, params, constraint=constraint))


@pytest.mark.parametrize("generalise", [False, True])
def test_greedy_constrained_equals_free_when_the_free_answer_fits(
    session: Session, generalise: bool
) -> None:
    prompt = ask(session, "What is the capital of France?")
    free = session.engine.generate(Request(prompt, SamplingParams(max_tokens=60)))
    assert free.finish_reason == "stop" and len(free.token_ids) > 3
    # The free answer spelled out, or with every word as a class of letters (a real choice).
    pattern = regex_literal(free.text)
    if generalise:
        pattern = re.sub(r"[A-Za-z]+", "[A-Za-z]+", pattern)
    free, constrained = free_and_constrained(session, prompt, ConstraintSpec("regex", pattern))
    assert constrained.text == free.text and constrained.finish_reason == "stop"
    eos = set(session.tokenizer.eos_ids)
    # The regex is finished at the answer's last character: no eos token is spent on it.
    assert list(constrained.token_ids) == [t for t in free.token_ids if t not in eos]
    # Log-probabilities are the model's own, not the masked distribution's.
    assert [lp.logprob for lp in constrained.logprobs] == pytest.approx(
        [lp.logprob for lp in free.logprobs[: len(constrained.logprobs)]]
    )
    assert min(lp.logprob for lp in constrained.logprobs) < -0.01


def test_greedy_constrained_equals_free_json_answer(session: Session) -> None:
    prompt = ask(session, "Reply with a JSON object with keys city and country for Paris.")
    free = session.engine.generate(Request(prompt, SamplingParams(max_tokens=60)))
    answer = json.loads(free.text)  # this model answers in bare JSON here
    schema = {
        "type": "object",
        "properties": {k: {"type": "string"} for k in answer},
        "required": list(answer),
    }
    free, constrained = free_and_constrained(session, prompt, ConstraintSpec("json_schema", schema))
    assert constrained.text == free.text
    eos = set(session.tokenizer.eos_ids)
    assert list(constrained.token_ids) == [t for t in free.token_ids if t not in eos]


@pytest.mark.parametrize(
    ("question", "pattern"),
    [
        ("Should I bring an umbrella?", r"(yes|no)"),
        ("When were you born?", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        ("Call me.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
        ("Name an animal.", r"[A-Z][a-z]{2,12}"),
    ],
)
def test_regex_answers_match_under_seeded_sampling(
    session: Session, question: str, pattern: str
) -> None:
    constraint = session.compile_constraint(ConstraintSpec("regex", pattern, field="--regex"))
    requests = [
        Request(
            ask(session, question),
            SamplingParams(max_tokens=40, temperature=1.0, seed=seed),
            constraint=constraint,
        )
        for seed in range(4)
    ]
    results = [h.result() for h in session.engine.submit_all(requests)]
    for result in results:
        assert re.fullmatch(pattern, result.text), result.text
        assert result.finish_reason == "stop"
    again = session.engine.generate(requests[0])
    assert again.token_ids == results[0].token_ids  # seeded: the same answer alone


def test_compile_constraint_names_the_field_and_is_safe_from_threads(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = ConstraintSpec("json_schema", {"type": "frobnicate"}, field="--json-schema")
    with pytest.raises(InvalidParameterError, match=r"^--json-schema: .*frobnicate"):
        session.compile_constraint(bad)
    import localinfer.constraints.compiler as compiler_module

    built: list[object] = []

    class Counted(compiler_module.ConstraintCompiler):
        def __init__(self, vocabulary: Any) -> None:
            built.append(self)
            super().__init__(vocabulary)

    monkeypatch.setattr(compiler_module, "ConstraintCompiler", Counted)
    monkeypatch.setattr(session, "_compiler", None)  # as a fresh session has it
    compiled: list[Any] = []
    errors: list[BaseException] = []

    def compile_one(i: int) -> None:
        try:
            compiled.append(session.compile_constraint(ConstraintSpec("regex", f"a{{{i + 1}}}")))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=compile_one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(compiled) == 6
    assert len(built) == 1  # one vocabulary index, however many threads asked at once
    assert compiled[0].vocab_size == session.engine.runner.info.vocab_size
