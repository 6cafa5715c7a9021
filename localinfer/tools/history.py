"""An OpenAI chat history, checked, in the shape Hugging Face chat templates expect.

OpenAI sends a call's arguments as JSON text and a tool result with only the id of its call;
templates want the arguments as an object and often the tool's name on the result. A history
that gets this wrong is refused with the field named (``messages[2].tool_calls[0].function.
arguments: not valid JSON``) rather than rendered into a prompt the model cannot follow.

For the GENERIC family (a template without tool support) calls and results become plain text in
the syntax the generic prompt teaches (prompt.py), so any template can render them.
"""

from __future__ import annotations

import json
from typing import Any

from localinfer.errors import InvalidParameterError
from localinfer.tools.call_json import loads, read_arguments
from localinfer.tools.family import ToolFamily, template_call_id

ROLES = ("system", "developer", "user", "assistant", "tool")


def _bad(field: str, message: str) -> InvalidParameterError:
    return InvalidParameterError(f"{field}: {message}")


def _text(where: str, content: object) -> str | None:
    """A message's content as text: a string, a list of text parts joined, or None."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "must be a string or an array of text parts")
    pieces = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text"):
            raise _bad(f"{where}.content[{j}]", "only text parts are supported")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{where}.content[{j}].text", "must be a string")
        pieces.append(part["text"])
    return "".join(pieces)


def _arguments(where: str, value: object) -> dict[str, Any]:
    if isinstance(value, str) and not value.strip():
        return {}  # some clients send "" for a call without arguments
    if isinstance(value, str):
        try:
            parsed = loads(value)
        except ValueError:
            raise _bad(where, "not valid JSON") from None
        if not isinstance(parsed, dict):
            raise _bad(where, f"must be a JSON object, not {type(parsed).__name__}")
        return parsed
    arguments = read_arguments(value)
    if arguments is None:
        raise _bad(where, "must be a JSON object (as a string)")
    return arguments


def _calls(where: str, value: object, family: ToolFamily) -> list[dict[str, Any]]:
    """An assistant's ``tool_calls`` in the template's shape (arguments as objects)."""
    if not isinstance(value, list):
        raise _bad(f"{where}.tool_calls", "must be an array")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise _bad(at, "must be an object")
        if call.get("type", "function") != "function":
            raise _bad(f"{at}.type", f"only 'function' calls are supported, not {call['type']!r}")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"{at}.id", "a call id (a non-empty string) is required")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _bad(f"{at}.function", "an object with the function's name is required")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{at}.function.name", "a function name (a non-empty string) is required")
        arguments = _arguments(f"{at}.function.arguments", function.get("arguments"))
        calls.append(
            {
                "id": template_call_id(call_id, family),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return calls


def _check_message(i: int, message: object) -> tuple[str, str]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise _bad(where, f"must be an object, not {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", f"{role!r} is not one of {', '.join(ROLES)}")
    return where, role


def template_messages(messages: list[dict[str, Any]], family: ToolFamily) -> list[dict[str, Any]]:
    """Checked and converted messages for the chat template of ``family``."""
    if not isinstance(messages, list):
        raise _bad("messages", "must be an array")
    names: dict[str, str] = {}  # call id (as the template gets it) -> tool name
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where, role = _check_message(i, message)
        text = _text(where, message.get("content"))
        if role == "assistant":
            raw_calls = message.get("tool_calls")
            calls = _calls(where, raw_calls, family) if raw_calls else []
            for call in calls:
                names[call["id"]] = call["function"]["name"]
            turn = {"role": "assistant", "content": text or "", "tool_calls": calls}
            reasoning = message.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                turn["reasoning_content"] = reasoning  # the template keeps or drops it (Qwen3)
                if family == ToolFamily.HARMONY:
                    _harmony_thinking(turn, reasoning)
            out.append(turn)
        elif role == "tool":
            out.append(_tool_result(where, message, text, names, family))
        else:
            if text is None:
                raise _bad(f"{where}.content", f"a {role} message needs content")
            out.append({"role": "system" if role == "developer" else role, "content": text})
    if family == ToolFamily.GENERIC:
        return _as_plain_text(out)
    if family == ToolFamily.LLAMA3:
        out = _one_call_per_turn(out)
    if family == ToolFamily.HARMONY:
        out = _harmony_turns(out)
    for message in out:
        if message["role"] == "assistant" and not message["tool_calls"]:
            # Llama's templates test ``'tool_calls' in message``: an empty list would count.
            del message["tool_calls"]
    return out


def _tool_result(
    where: str, message: dict[str, Any], text: str | None, names: dict[str, str], family: ToolFamily
) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
    if text is None:
        raise _bad(f"{where}.content", "a tool message needs content")
    mapped = template_call_id(call_id, family)
    if mapped not in names:
        raise _bad(f"{where}.tool_call_id", f"no earlier tool call has the id {call_id[:80]!r}")
    return {"role": "tool", "tool_call_id": mapped, "name": names[mapped], "content": text}


def _one_call_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Llama 3's templates refuse an assistant turn with several calls: one turn per call."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") or []
        if len(calls) <= 1:
            out.append(message)
            continue
        for n, call in enumerate(calls):
            content = message["content"] if n == 0 else ""
            out.append({**message, "content": content, "tool_calls": [call]})
    return out


def _harmony_thinking(turn: dict[str, Any], reasoning: str) -> None:
    """gpt-oss's template reads a turn's reasoning as ``thinking`` (its analysis message, kept
    for a tool-call turn with no later answer). With calls it refuses content and thinking
    together: the reasoning is kept (the content of such a turn is a preamble)."""
    turn["thinking"] = reasoning
    if turn["tool_calls"]:
        turn["content"] = ""


def _harmony_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """gpt-oss's template renders one call per assistant turn and names a tool result after the
    call just before it: a turn of several calls becomes one turn per call, each followed by
    its result."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        calls = message.get("tool_calls") or []
        i += 1
        if message["role"] != "assistant" or len(calls) <= 1:
            out.append(message)
            continue
        results: dict[str, list[dict[str, Any]]] = {}
        while i < len(messages) and messages[i]["role"] == "tool":
            results.setdefault(messages[i]["tool_call_id"], []).append(messages[i])
            i += 1
        for n, call in enumerate(calls):
            part = {"role": "assistant", "content": "", "tool_calls": [call]}
            out.append({**message, "tool_calls": [call]} if n == 0 else part)
            out.extend(results.pop(call["id"], []))
        out.extend(result for rest in results.values() for result in rest)
    return out


def call_block(name: str, arguments: dict[str, Any]) -> str:
    """A call in the syntax the generic prompt teaches."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def result_block(name: str, content: str) -> str:
    return f'<tool_response name="{name}">\n{content}\n</tool_response>'


def _as_plain_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GENERIC: calls as text in the assistant's turn, results as a user turn that also takes
    the results and user text right after it (many templates insist that user and assistant
    alternate)."""
    out: list[dict[str, Any]] = []
    results_turn = False  # the last turn in ``out`` holds tool results
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "tool":
            content = result_block(message["name"], content)
        if role == "assistant":
            calls = [call_block(**c["function"]) for c in message["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(filter(None, [content, *calls]))})
        elif results_turn and role in ("tool", "user"):
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n\n" + content}
            continue
        else:
            out.append({"role": "user" if role == "tool" else role, "content": content})
        results_turn = role == "tool"
    return out
