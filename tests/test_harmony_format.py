"""gpt-oss's harmony format, read from its real chat template (tests/fixtures/templates/
openai-gpt-oss-120b.jinja): the analysis channel is the reasoning and the final channel the
answer, the headers between are neither, whatever the cut; a budget forces the end of the
analysis and the final header; a constraint starts on the final channel; reasoning_effort is the
template's own; calls are read from the commentary channel only; earlier turns go back as the
template expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.engine.reasoning import ReasoningSplitter
from localinfer.loading.chat_template import ChatTemplate
from localinfer.tools import (
    ToolChoice,
    ToolFamily,
    detect_family,
    parse_tool_calls,
    parse_tools,
    prompt_inputs,
    template_messages,
)
from localinfer.tools.thinking import (
    HARMONY,
    Thinking,
    detect_thinking,
    reasoning_spec,
    template_switch,
)
from tests.test_reasoning_split import TwoDigits, ids, run

TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja"
ASK = [{"role": "user", "content": "What is 2+2?"}]
ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"
CONSTRAINED = "<|start|>assistant<|channel|>final <|constrain|>json<|message|>"
TOOLS = parse_tools(
    [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
)


def source() -> str:
    return TEMPLATE.read_text()


def render(messages, tools=None, **variables) -> str:
    template = ChatTemplate(source(), bos_token="<|startoftext|>", eos_token="<|return|>")
    return template.render(messages, add_generation_prompt=True, tools=tools, **variables)


def spec(thinking: Thinking | None = None):
    thinking = thinking or Thinking()
    fmt = detect_thinking(source())
    prompt = render(ASK, **template_switch(fmt, thinking))
    return reasoning_spec(fmt, prompt, thinking, lambda text: [len(text)])


def split(text: str, step: int):
    splitter = ReasoningSplitter(spec())
    reasoning, answer = [], []
    for at in range(0, len(text), step):
        r, a = splitter.feed(text[at : at + step])
        reasoning.append(r)
        answer.append(a)
    r, a = splitter.finish()
    return "".join(reasoning) + r, "".join(answer) + a


def test_the_template_is_harmony_for_reasoning_and_calls() -> None:
    fmt = detect_thinking(source())
    assert fmt == HARMONY and fmt.toggle is None and fmt.effort == "reasoning_effort"
    assert detect_family(source()) == ToolFamily.HARMONY
    found = spec()
    assert found is not None and not found.starts_inside and found.budget is None


@pytest.mark.parametrize(
    ("effort", "level"), [("low", "low"), ("medium", "medium"), ("high", "high"), ("max", "high")]
)
def test_reasoning_effort_is_the_template_s_own(effort: str, level: str) -> None:
    thinking = Thinking(effort=effort)
    variables = template_switch(HARMONY, thinking)
    assert variables == {"reasoning_effort": level}
    assert f"Reasoning: {level}\n" in render(ASK, **variables)
    assert spec(thinking).budget is None  # the model's effort, not a cap on its tokens


def test_thinking_off_and_a_budget_force_the_final_header() -> None:
    off = spec(Thinking(enabled=False))
    assert off.budget == 0 and off.end_ids == (len("<|end|>" + FINAL),)
    assert spec(Thinking(budget=7)).budget == 7
    assert spec().header_ids == (len(FINAL),)


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{ANALYSIS}Add them.<|end|>{FINAL}It is 4.", ("Add them.", "It is 4.")),
        ("<|channel|>final<|message|>It is 4.", ("", "It is 4.")),  # no analysis
        (f"{ANALYSIS}A<|end|><|start|>assistant{ANALYSIS}B<|end|>{FINAL}C", ("A\n\nB", "C")),
        (f"{ANALYSIS}x<|end|>{CONSTRAINED}{{}}", ("x", "{}")),
        (f"{ANALYSIS}still thinking", ("still thinking", "")),  # cut before its end
        (f"{ANALYSIS}done<|end|><|start|>assistant<|chan", ("done", "")),  # a header cut short
        (f"It is 4. {ANALYSIS}", ("", f"It is 4. {ANALYSIS}")),  # typed later: text
    ],
)
def test_analysis_is_reasoning_and_final_is_the_answer(text, expected, step: int) -> None:
    assert split(text, step) == expected


def test_a_call_after_the_analysis_is_answer_text_for_the_tool_parser() -> None:
    call = "<|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json"
    reasoning, answer = split(f"{ANALYSIS}Look it up.<|end|>{call}<|message|>{{}}", 3)
    assert reasoning == "Look it up." and answer == call + "<|message|>{}"


CALLS = [
    "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>"
    '{"q": "weather"}<|call|>',
    '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": "weather"}',
    "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=f"
    'unctions.lookup <|constrain|>json<|message|>{"q": "weather"}',
]


@pytest.mark.parametrize("text", CALLS)
def test_calls_are_read_from_the_commentary_channel(text: str) -> None:
    parsed = parse_tool_calls(text, ToolFamily.HARMONY, TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("lookup", '{"q":"weather"}')]
    assert parsed.content in (None, "Checking.")  # a preamble's text is content, its header not


@pytest.mark.parametrize(
    "text",
    [
        "<|channel|>commentary to=functions.launch <|constrain|>json<|message|>{}",  # unknown
        "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{oops",  # bad
    ],
)
def test_a_call_that_is_not_one_stays_text(text: str) -> None:
    parsed = parse_tool_calls(text, ToolFamily.HARMONY, TOOLS)
    assert parsed.calls == [] and parsed.content == text


def test_streamed_calls_match_whole_ones() -> None:
    from localinfer.tools import ToolCallArguments, ToolCallStart, ToolCallStream

    for text in CALLS:
        stream = ToolCallStream(ToolFamily.HARMONY, TOOLS)
        deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish()
        starts = [d.name for d in deltas if isinstance(d, ToolCallStart)]
        arguments = "".join(d.fragment for d in deltas if isinstance(d, ToolCallArguments))
        assert (starts, arguments) == (["lookup"], '{"q":"weather"}')


def test_earlier_turns_go_back_as_the_template_expects() -> None:
    def call(i: str, q: int) -> dict:
        arguments = f'{{"q": {q}}}'
        return {"id": i, "type": "function", "function": {"name": "lookup", "arguments": arguments}}

    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "Two lookups.",
            "tool_calls": [call("a", 1), call("b", 2)],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "a", "content": "one"},
        {"role": "tool", "tool_call_id": "b", "content": "two"},
    ]
    messages = template_messages(history, ToolFamily.HARMONY)
    inputs = prompt_inputs(ToolFamily.HARMONY, messages, TOOLS, ToolChoice("auto"))
    prompt = render(inputs.messages, tools=inputs.tools)
    # The analysis of a tool-call turn is kept; each call is followed by its own result.
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Two lookups.<|end|>"
        '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": 1}'
        '<|call|><|start|>functions.lookup to=assistant<|channel|>commentary<|message|>"one"'
        "<|end|><|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>"
        '{"q": 2}<|call|><|start|>functions.lookup to=assistant<|channel|>commentary'
        '<|message|>"two"<|end|><|start|>assistant'
    ) in prompt
    # After a final answer, the earlier reasoning is dropped (the template's rule).
    done = [*ASK, {"role": "assistant", "content": "4", "reasoning_content": "Easy."}, *ASK]
    later = render(template_messages(done, ToolFamily.HARMONY))
    assert "Easy." not in later and "<|channel|>final<|message|>4<|end|>" in later


def test_the_engine_splits_harmony_and_counts_only_the_analysis() -> None:
    script = f"{ANALYSIS}abc<|end|>{FINAL}Answer."
    result, _ = run(script, spec_bytes(), max_tokens=200)
    assert (result.reasoning, result.text) == ("abc", "Answer.")
    assert result.metrics.reasoning_tokens == len("abc<|end|>")  # the end's first token counts


@pytest.mark.parametrize("budget", [0, 1, 6])
def test_the_budget_forces_the_end_and_the_final_header(budget: int) -> None:
    script = ANALYSIS + "y" * 80 + "<|end|>" + FINAL + "Done"
    result, _ = run(script, spec_bytes(Thinking(budget=budget)), max_tokens=120)
    assert result.reasoning == "y" * budget
    # The forced end and header are neither part; the script goes on where it was, as the
    # answer now.
    assert result.text.startswith("y" * 20)


def test_a_constraint_starts_on_the_final_channel() -> None:
    constraint = TwoDigits()
    # The script ends the analysis and writes no header: the engine forces it (whatever the
    # script says meanwhile), then the constraint masks the final channel's first tokens.
    script = ANALYSIS + "free text!<|end|>" + "#" * len(FINAL) + "42 and more"
    result, _ = run(script, spec_bytes(), max_tokens=200, constraint=constraint)
    assert (result.reasoning, result.text) == ("free text!", "42")
    assert constraint.taken == [ord("4"), ord("2")]


def spec_bytes(thinking: Thinking | None = None):
    """The harmony split for the tests' byte tokenizer (one token a byte)."""
    return reasoning_spec(HARMONY, "<|start|>assistant", thinking or Thinking(), ids)
