"""A thinking model's reasoning apart from its answer (engine/reasoning.py): the streaming
splitter's edge cases, and the engine on a scripted model: a tag split over tokens, no closing
tag, a tag typed later in the answer, a budget of 0 and of exactly N, a constraint that starts
when the reasoning ends."""

from __future__ import annotations

import pytest

from localinfer.engine import Engine, Request, SamplingParams
from localinfer.engine.reasoning import ReasoningSpec, ReasoningSplitter
from tests.test_engine_model import ByteTokenizer, ScriptRunner


def split_all(pieces: list[str], spec: ReasoningSpec | None = None) -> tuple[str, str]:
    splitter = ReasoningSplitter(spec or ReasoningSpec())
    reasoning, answer = [], []
    for piece in pieces:
        r, a = splitter.feed(piece)
        reasoning.append(r)
        answer.append(a)
    r, a = splitter.finish()
    return "".join(reasoning) + r, "".join(answer) + a


def chars(text: str) -> list[str]:
    return list(text)  # one character a "token": every tag is split


@pytest.mark.parametrize("pieces", [chars, lambda t: [t], lambda t: t.split(" ")])
def test_reasoning_then_answer_however_the_text_is_cut(pieces) -> None:
    text = "<think>\nLet me see. 2+2=4\n</think>\n\nThe answer is 4."
    parts = pieces(text)
    if pieces is not chars and len(parts) > 1:  # split() drops the spaces: put them back
        parts = [p + " " for p in parts[:-1]] + [parts[-1]]
    assert split_all(parts) == ("Let me see. 2+2=4", "The answer is 4.")  # ends trimmed


def test_no_reasoning_block_is_all_answer_and_a_later_tag_stays_text() -> None:
    assert split_all(chars("Hello <think>x</think>")) == ("", "Hello <think>x</think>")
    assert split_all(chars("<thin")) == ("", "<thin")  # a tag that never completed is text


def test_no_closing_tag_is_all_reasoning() -> None:
    assert split_all(chars("<think>still thinking</thi")) == ("still thinking</thi", "")


def test_a_prompt_that_opened_the_block() -> None:
    spec = ReasoningSpec(starts_inside=True)
    assert split_all(chars("hmm</think>\nYes."), spec) == ("hmm", "Yes.")


def test_a_budget_needs_the_closing_ids() -> None:
    with pytest.raises(ValueError, match="closing tag"):
        ReasoningSpec(budget=3)
    with pytest.raises(ValueError, match=">= 0"):
        ReasoningSpec(budget=-1, end_ids=(1,))


def ids(text: str) -> list[int]:
    return list(text.encode())


END = tuple(ids("</think>\n\n"))


def run(script: str, spec: ReasoningSpec, max_tokens: int = 64, constraint=None):
    runner = ScriptRunner(ids(script), end=0)
    engine = Engine(runner, ByteTokenizer(), background=False)
    handle = engine.submit(
        Request(
            ids("Q?"), SamplingParams(max_tokens=max_tokens), reasoning=spec, constraint=constraint
        )  # fmt: skip
    )
    events = []
    while engine.has_work():
        engine.step()
        events += handle.poll()
    return handle.result(), events


def test_the_engine_streams_reasoning_and_answer_apart() -> None:
    result, events = run("<think>abc</think>\n\nAnswer.", ReasoningSpec())
    assert (result.reasoning, result.text) == ("abc", "Answer.")
    assert all(not (e.reasoning and e.text) for e in events)  # never mixed in one event
    assert result.metrics.reasoning_tokens == len("abc</think>")
    assert result.finish_reason == "stop"


def test_no_closing_tag_before_max_tokens_is_all_reasoning() -> None:
    result, _ = run("<think>" + "x" * 100, ReasoningSpec(), max_tokens=20)
    assert result.finish_reason == "length"
    assert (result.reasoning, result.text) == ("x" * 13, "")


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_the_budget_is_exact(budget: int) -> None:
    spec = ReasoningSpec(budget=budget, end_ids=END)
    result, _ = run("<think>" + "y" * 50 + "</think>\n\nDone", spec, max_tokens=40)
    assert result.reasoning == "y" * budget
    assert result.text.startswith("y")  # the script goes on where it was: now as the answer


def test_a_budget_when_the_prompt_opened_the_block() -> None:
    spec = ReasoningSpec(starts_inside=True, budget=0, end_ids=END)
    result, _ = run("z" * 30, spec, max_tokens=16)
    assert result.reasoning == ""  # closed before the first token
    assert result.text == "z" * (16 - len(END))


class TwoDigits:
    """A constraint allowing the bytes 0-9 until two are taken (a stand-in for a schema)."""

    vocab_size = 256

    def __init__(self) -> None:
        self.taken: list[int] = []

    def start(self) -> TwoDigits:
        return self

    def fill_allowed(self, out) -> None:
        out[:] = 0
        for token in range(ord("0"), ord("9") + 1):
            out[token // 32] |= 1 << (token % 32)

    def advance(self, token_id: int) -> None:
        self.taken.append(token_id)

    def is_finished(self) -> bool:
        return len(self.taken) == 2

    def accepted_prefix(self, tokens) -> int:
        return len(tokens)

    def rollback(self, count: int) -> None:
        del self.taken[len(self.taken) - count :]


def test_a_constraint_starts_when_the_reasoning_ends() -> None:
    constraint = TwoDigits()
    # The constraint applies from the token after the closing tag (a real model then writes no
    # blank lines the grammar refuses).
    result, _ = run("<think>free text!</think>42 and more", ReasoningSpec(),
                    constraint=constraint)  # fmt: skip
    assert result.reasoning == "free text!"
    assert result.text == "42" and result.finish_reason == "stop"
    assert constraint.taken == [ord("4"), ord("2")]  # it saw the answer's tokens only
    plain, _ = run("<think>free text!</think>42", None, constraint=TwoDigits())
    assert plain.text == "00"  # without the split it masks from the first token: no thinking


def test_whitespace_inside_the_reasoning_is_kept() -> None:
    text = "<think>\n\nstep one\n\nstep two  \n</think>\n\nok"
    assert split_all(chars(text)) == ("step one\n\nstep two", "ok")
