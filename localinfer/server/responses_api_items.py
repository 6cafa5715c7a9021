"""The items of a Responses API answer's ``output`` and its usage, as the ``openai`` SDK's
types (openai/types/responses) read them: a ``reasoning`` item (a thinking model's reasoning),
a ``message`` item (the text) and a ``function_call`` item per call.

OpenAI's own models return a summary of their reasoning, or none; an open-weight model's
reasoning is its text, which OpenAI's gpt-oss convention (and vLLM's server) writes as
``reasoning_text`` content beside an empty ``summary``. A response cut short inside the
reasoning has no message, as OpenAI answers when a reasoning model runs out of output tokens.
"""

from __future__ import annotations

import uuid
from typing import Any

from localinfer.server.answer_render import FinishedAnswer


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message; ``text`` None while its content part is still to come."""
    content = [] if text is None else [output_text(text)]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A thinking model's reasoning, as gpt-oss's open-weight convention writes it: the text as
    ``reasoning_text`` content, no summary; ``text`` None while it is still to come."""
    content = [] if text is None else [reasoning_text(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def usage(answer: FinishedAnswer) -> dict[str, Any]:
    metrics = answer.metrics
    prompt, completion = answer.prompt_tokens, answer.completion_tokens
    if metrics is not None:
        prompt, completion = metrics.prompt_tokens, metrics.completion_tokens
    return {
        "input_tokens": prompt,
        # cache_write_tokens counts OpenAI's billed prompt-cache writes: none here.
        "input_tokens_details": {
            "cached_tokens": metrics.cached_tokens if metrics is not None else 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": metrics.reasoning_tokens if metrics is not None else 0
        },
        "total_tokens": prompt + completion,
    }


def whole_output(answer: FinishedAnswer) -> list[dict[str, Any]]:
    """The output items of a whole answer: its reasoning, its text as a message (also when
    empty, unless the answer has calls and only whitespace beside them, or was cut short in
    its reasoning), then one item per call; the last is incomplete when cut short."""
    cut = answer.finish_reason == "length"
    items = []
    if answer.reasoning:
        items.append(reasoning_item(new_id("rs"), answer.reasoning, "completed"))
    if answer.content.strip() or not (answer.calls or (cut and answer.reasoning)):
        items.append(message_item(new_id("msg"), answer.content, "completed"))
    for call in answer.calls:
        items.append(call_item(new_id("fc"), call.id, call.name, call.arguments, "completed"))
    if cut:
        items[-1]["status"] = "incomplete"
    return items
