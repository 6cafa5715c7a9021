"""`generate` on a thinking model: --thinking on|off and --thinking-budget reach the template and
the engine; the reasoning prints dimmed on stderr, apart from the answer on stdout, or not at
all with --hide-thinking."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from localinfer.commands.generate import _prompt
from localinfer.engine.types import SamplingParams
from localinfer.loading.chat_template import ChatTemplate
from localinfer.session import open_session
from localinfer.tools.reasoning_print import DIM, RESET, ReasoningPrinter

QWEN3 = Path(__file__).parent / "fixtures" / "templates" / "Qwen-Qwen3-0.6B.jinja"


@pytest.fixture(scope="module")
def qwen3_session():
    session = open_session(backend="llamacpp", slots=1, ctx=256)
    template = session.model.chat_template
    session.model.chat_template = ChatTemplate(QWEN3.read_text(), eos_token="<|im_end|>")
    yield session
    session.model.chat_template = template
    session.close()


def args(**over) -> argparse.Namespace:
    base = {"suffix": None, "raw": False, "system": None, "prompt": "2+2?", "thinking": None,
            "thinking_budget": None}  # fmt: skip
    return argparse.Namespace(**{**base, **over})


def test_thinking_flags_reach_the_template_and_the_engine(qwen3_session) -> None:
    tok = qwen3_session.model.tokenizer
    ids, _, spec = _prompt(qwen3_session, args(), SamplingParams())
    assert spec is not None and spec.budget is None and not spec.starts_inside
    ids_off, _, spec_off = _prompt(qwen3_session, args(thinking="off"), SamplingParams())
    assert spec_off is None  # the template closed the block in the prompt
    assert tok.decode(ids_off).rstrip().endswith("</think>") and ids_off != ids
    _, _, budgeted = _prompt(qwen3_session, args(thinking_budget=7), SamplingParams())
    assert budgeted.budget == 7 and budgeted.end_ids


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_reasoning_prints_dimmed_then_closes_once() -> None:
    out = Terminal()
    printer = ReasoningPrinter(out)
    printer.reasoning("think")
    printer.reasoning(" more")
    printer.answer_starts()
    printer.answer_starts()
    assert out.getvalue() == f"{DIM}think more{RESET}\n\n"
    hidden = Terminal()
    quiet = ReasoningPrinter(hidden, hidden=True)
    quiet.reasoning("think")
    quiet.answer_starts()
    assert hidden.getvalue() == ""
    piped = io.StringIO()
    plain = ReasoningPrinter(piped)
    plain.reasoning("think")
    plain.answer_starts()
    assert piped.getvalue() == "think\n\n"  # no colour codes in a file
