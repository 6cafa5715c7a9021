"""localinfer.tools: tool calls read out of whole answers, per family.

The cases are answers as the models write them (Qwen 2.5/3, Hermes, Llama 3.1/3.2, Mistral Nemo
and Small 3.x), malformed calls, and ordinary answers that only look like JSON. test_tools_stream
feeds the same answers in chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from localinfer.tools import ParsedOutput, ToolFamily, parse_tool_calls, parse_tools

TOOLS = parse_tools(
    [
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
        {"type": "function", "function": {"name": "search-web"}},
        {"type": "function", "function": {"name": "now"}},
    ]
)
H, L, M, G = ToolFamily.HERMES, ToolFamily.LLAMA3, ToolFamily.MISTRAL, ToolFamily.GENERIC
HY = ToolFamily.HARMONY
HY_CALL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
PARIS = ("get_weather", '{"city":"Paris"}')
ROME = ("get_weather", '{"city":"Rome","unit":"celsius"}')


@dataclass(frozen=True)
class Case:
    family: ToolFamily
    text: str
    content: str | None  # "<same>": the whole text
    calls: tuple[tuple[str, str], ...] = ()


SAME = "<same>"
CALL_P = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
CALL_R = '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}'
FILTERS = '{"lang":["de","fr"],"max":3,"safe":true,"since":null}}'
LLAMA_P = '{"name": "get_weather", "parameters": {"city": "Paris"}}'

CASES = {
    # HERMES (Qwen 2.5 / Qwen 3 / Hermes 3)
    "qwen one call": Case(H, f"<tool_call>\n{CALL_P}\n</tool_call>", None, (PARIS,)),
    "qwen parallel": Case(
        H,
        f"<tool_call>\n{CALL_P}\n</tool_call>\n<tool_call>\n{CALL_R}\n</tool_call>",
        None,
        (PARIS, ROME),
    ),
    "text then call": Case(
        H,
        f"I'll check the weather.\n<tool_call>\n{CALL_P}\n</tool_call>",
        "I'll check the weather.\n",
        (PARIS,),
    ),
    "text around calls": Case(
        H,
        f"First:<tool_call>{CALL_P}</tool_call> then <tool_call>{CALL_R}</tool_call> done.",
        "First: then  done.",
        (PARIS, ROME),
    ),
    "qwen3 thinking": Case(
        H,
        f"<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{CALL_P}\n</tool_call>",
        "<think>\nThe user wants weather.\n</think>\n\n",
        (PARIS,),
    ),
    "leading newline only": Case(H, f"\n\n<tool_call>{CALL_P}</tool_call>\n", None, (PARIS,)),
    "no closing tag at the end": Case(H, f"<tool_call>\n{CALL_P}\n", None, (PARIS,)),
    "arguments as a string": Case(
        H,
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        None,
        (PARIS,),
    ),
    "array in one block": Case(
        H, f"<tool_call>[{CALL_P}, {CALL_R}]</tool_call>", None, (PARIS, ROME)
    ),
    "no arguments": Case(H, '<tool_call>{"name": "now"}</tool_call>', None, (("now", "{}"),)),
    "non-ascii and nesting": Case(
        H,
        '<tool_call>{"name": "search-web", "arguments": {"q": "Zürich café", '
        '"filters": {"lang": ["de", "fr"], "max": 3, "safe": true, "since": null}}}</tool_call>',
        None,
        (("search-web", '{"q":"Zürich café","filters":' + FILTERS),),
    ),
    "plain answer": Case(H, "The weather in Paris is sunny, 24°C.", SAME),
    "whitespace answer": Case(H, " \n ", None),
    "empty answer": Case(H, "", None),
    "json in prose": Case(H, f"You could send {CALL_P} to the API.", SAME),
    "tag mentioned in prose": Case(H, "Calls go in a <tool_call> block, like <tool_ca", SAME),
    "almost a tag": Case(H, "a <tool_cal> b <tool_callx> c </tool_call>", SAME),
    "bad json": Case(
        H, '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>', SAME
    ),
    "unknown tool": Case(H, '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', SAME),
    "missing name": Case(H, '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', SAME),
    "arguments not an object": Case(
        H, '<tool_call>{"name": "now", "arguments": [1]}</tool_call>', SAME
    ),
    "nan in arguments": Case(
        H, '<tool_call>{"name": "now", "arguments": {"x": NaN}}</tool_call>', SAME
    ),
    "cut short": Case(H, '<tool_call>\n{"name": "get_weather", "arguments": {"ci', SAME),
    "text after json in block": Case(H, f"<tool_call>{CALL_P} and more</tool_call>", SAME),
    "empty block": Case(H, "<tool_call></tool_call>", SAME),
    "valid then malformed": Case(
        H,
        f"<tool_call>{CALL_P}</tool_call>\n<tool_call>{{oops</tool_call>",
        "\n<tool_call>{oops</tool_call>",
        (PARIS,),
    ),
    "generic family reads tags": Case(
        G, f"Sure.\n<tool_call>\n{CALL_P}\n</tool_call>", "Sure.\n", (PARIS,)
    ),
    "generic plain": Case(G, "Hello! How can I help?", SAME),
    # LLAMA3 (Llama 3.1 / 3.2)
    "llama json answer": Case(L, LLAMA_P, None, (PARIS,)),
    "llama with arguments key": Case(L, CALL_P, None, (PARIS,)),
    "llama leading whitespace": Case(L, f"\n {LLAMA_P}\n", None, (PARIS,)),
    "llama python tag": Case(L, f"<|python_tag|>{LLAMA_P}", None, (PARIS,)),
    "llama type key": Case(
        L,
        '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}',
        None,
        (PARIS,),
    ),
    "llama several": Case(
        L,
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "celsius"}}',
        None,
        (PARIS, ROME),
    ),
    "llama trailing semicolon": Case(L, f"<|python_tag|>{LLAMA_P};", None, (PARIS,)),
    "llama text then tag": Case(
        L, f"Let me look.\n<|python_tag|>{LLAMA_P}", "Let me look.\n", (PARIS,)
    ),
    "llama parameters as string": Case(
        L, '{"name": "get_weather", "parameters": "{\\"city\\": \\"Paris\\"}"}', None, (PARIS,)
    ),
    "llama plain": Case(L, "It is sunny in Paris today.", SAME),
    "llama json not a tool": Case(L, '{"name": "Alice", "parameters": {"age": 31}}', SAME),
    "llama json without parameters": Case(L, '{"name": "get_weather"}', SAME),
    "llama json with other keys": Case(
        L, '{"name": "get_weather", "parameters": {"city": "Paris"}, "note": "x"}', SAME
    ),
    "llama json then prose": Case(L, f"{LLAMA_P}\nThat is the call you need.", SAME),
    "llama prose then json": Case(L, f"Use this: {LLAMA_P}", SAME),
    "llama json array answer": Case(L, '[{"name": "get_weather", "parameters": {}}]', SAME),
    "llama ordinary json answer": Case(L, '{"city": "Paris", "temp": 24}', SAME),
    "llama builtin tool syntax": Case(L, '<|python_tag|>brave_search.call(query="paris")', SAME),
    "llama cut short": Case(L, '{"name": "get_weather", "parameters": {"ci', SAME),
    "llama one bad of two": Case(L, f'{LLAMA_P}; {{"name": "rm", "parameters": {{}}}}', SAME),
    "llama tag then prose": Case(L, f"Sure <|python_tag|>{LLAMA_P} done", SAME),
    # MISTRAL (Nemo: JSON array; Small 3.2 / Devstral: name[ARGS]{...})
    "mistral array": Case(M, f"[TOOL_CALLS][{CALL_P}]", None, (PARIS,)),
    "mistral parallel": Case(M, f"[TOOL_CALLS][{CALL_P}, {CALL_R}]", None, (PARIS, ROME)),
    "mistral with id": Case(
        M,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}]',
        None,
        (PARIS,),
    ),
    "mistral space and object": Case(M, f"[TOOL_CALLS] {CALL_P}", None, (PARIS,)),
    "mistral text first": Case(M, f"Checking.[TOOL_CALLS][{CALL_P}]", "Checking.", (PARIS,)),
    "mistral text after": Case(M, f"[TOOL_CALLS][{CALL_P}] ok", " ok", (PARIS,)),
    "mistral v11": Case(M, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', None, (PARIS,)),
    "mistral v11 call id": Case(
        M, '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', None, (PARIS,)
    ),
    "mistral v11 parallel": Case(
        M,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "unit": "celsius"}',
        None,
        (PARIS, ROME),
    ),
    "mistral v11 no arguments": Case(M, "[TOOL_CALLS]now[ARGS]{}", None, (("now", "{}"),)),
    "mistral plain": Case(M, "Paris is sunny.", SAME),
    "mistral json prose": Case(M, f"Send [{CALL_P}] to it.", SAME),
    "mistral not json": Case(M, "[TOOL_CALLS] I cannot call tools.", SAME),
    "mistral cut short": Case(
        M, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa', SAME
    ),
    "mistral unknown tool": Case(M, '[TOOL_CALLS][{"name": "drop_db", "arguments": {}}]', SAME),
    "mistral v11 unknown tool": Case(M, "[TOOL_CALLS]drop_db[ARGS]{}", SAME),
    "mistral v11 bad args": Case(M, '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}', SAME),
    "mistral empty array": Case(M, "[TOOL_CALLS][]", SAME),
    # HARMONY (gpt-oss; the engine already took the analysis channel and the final header away)
    "harmony call": Case(HY, f'{HY_CALL}{{"city": "Paris"}}<|call|>', None, (PARIS,)),
    "harmony recipient in the role": Case(
        HY,
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}',
        None,
        (PARIS,),
    ),
    "harmony preamble then call": Case(
        HY,
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
        f'{HY_CALL}{{"city": "Paris"}}',
        "Checking.",
        (PARIS,),
    ),
    "harmony no arguments": Case(
        HY,
        "<|channel|>commentary to=functions.now <|constrain|>json<|message|>",
        None,
        (("now", "{}"),),
    ),  # fmt: skip
    "harmony plain": Case(HY, "Paris is sunny.", SAME),
    "harmony unknown tool": Case(
        HY, "<|channel|>commentary to=functions.drop_db <|constrain|>json<|message|>{}", SAME
    ),
    "harmony bad args": Case(HY, f'{HY_CALL}{{"city": Paris}}', SAME),
    "harmony other recipient": Case(
        HY, "<|channel|>analysis to=python<|message|>print(1)", "print(1)"
    ),
}


def expected(case: Case) -> ParsedOutput:
    content = case.text if case.content == SAME else case.content
    return ParsedOutput(content or None, [])


def shape(parsed: ParsedOutput) -> tuple[str | None, list[tuple[str, str]]]:
    return parsed.content, [(c.name, c.arguments) for c in parsed.calls]


@pytest.mark.parametrize("name", CASES)
def test_parse_tool_calls(name):
    case = CASES[name]
    parsed = parse_tool_calls(case.text, case.family, TOOLS)
    assert shape(parsed) == (expected(case).content, list(case.calls))
    for call in parsed.calls:
        assert isinstance(json.loads(call.arguments), dict)


def test_calls_get_fresh_ids_in_the_family_form():
    parsed = parse_tool_calls(f"[TOOL_CALLS][{CALL_P}, {CALL_R}]", M, TOOLS)
    ids = [c.id for c in parsed.calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    parsed = parse_tool_calls(f"<tool_call>{CALL_P}</tool_call>", H, TOOLS)
    assert parsed.calls[0].id.startswith("call_")


def test_without_tools_nothing_is_a_call():
    text = f"<tool_call>{CALL_P}</tool_call>"
    assert shape(parse_tool_calls(text, H, [])) == (text, [])
    assert shape(parse_tool_calls(LLAMA_P, L, [])) == (LLAMA_P, [])


def test_every_family_covered_with_calls_and_without():
    for family in ToolFamily:
        mine = [c for c in CASES.values() if c.family == family]
        assert any(c.calls for c in mine) and any(not c.calls for c in mine), family
