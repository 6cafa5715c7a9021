"""The rules of a valid request that no JSON Schema can state, for schemathesis (#44).

/openapi.json states every rule a body must follow that JSON Schema can express (types, bounds,
content by role, fields that need each other). A few more are real and refused with a 400 naming
the field, as OpenAI and Anthropic refuse them, but no schema can say them: they tie one part of
a body to another part, read a string's contents, or depend on the model served. schemathesis
generates bodies that break them and, reading the document, calls the 400 a schema-valid request
rejected (positive_data_acceptance). This hook drops exactly those failures, each by the refusal
the server writes, so that every other rejection still fails the run:

    scripts/fuzz-server          (its default SCHEMATHESIS_HOOKS is this file)

tests/test_schemathesis_server.py imports it (registering the hook for its in-process runs).
"""

from __future__ import annotations

import json
import re
from typing import Any

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

# A fragment of the server's refusal -> why no schema can state the rule it enforces.
UNSTATABLE = {
    # A result answers a call made earlier in the same history (OpenAI, Anthropic, Responses).
    "no earlier tool call has the id": "a tool result's id refers to an earlier call",
    "no earlier tool_use block has the id": "a tool_result's id refers to an earlier tool_use",
    # Unique across the items of a list, by one field of each.
    "duplicate tool name": "tool names are unique across tools",
    "another tool_use block has the id": "tool_use ids are unique across the conversation",
    # A choice names one of the tools the request sends.
    "no tool named": "tool_choice names a tool of tools",
    # A string whose contents must parse: a call's arguments are a JSON object's text.
    "not valid JSON": "a call's arguments are a JSON object's text",
    "must be a JSON object": "a call's arguments are a JSON object's text",
    # Position in a list: Anthropic's conversation ends with the user's turn (this server does
    # not continue an assistant prefill).
    "the last message must be a user message": "the last message is the user's",
    # A JSON schema (a tool's parameters) whose keywords contradict each other: satisfiable
    # is a property of the whole schema, which the constraint engine proves.
    "Unsatisfiable schema": "a tool's parameters schema can be satisfied",
    # A string whose contents must be an image (#37): an image_url part holds one inline, a
    # data: URL or base64 that decodes to a picture of a size localinfer reads.
    "not an image localinfer reads": "an image_url holds an image",
    "not valid base64": "an image_url holds base64",
    "must hold base64": "an image_url's data: URL holds base64",
    "only data: URLs and base64": "an image_url is a data: URL or base64",
    "remote image URLs are not fetched": "an image_url is inline, never a remote address",
    "a broken or truncated image": "an image_url holds a whole image",
    "larger than localinfer reads": "an image within localinfer's size limits",
    "images in one request": "at most 16 images across a request's messages",
    # The model's: its vocabulary and the context it is served with.
    "is outside the vocabulary": "token ids within the served model's vocabulary",
    "maximum context length is": "the prompt fits the context the model is served with",
    "more than the context holds": "each input fits the context the model is served with",
    "is not a reranker": "a rerank asks a model served that is a reranker",
}


# Not a rule but schemathesis' own rounding: it compares integers with a bound as doubles, so
# past 2**53 it generates an integer just outside a bound (a seed of -(2**63) - 191) as in range.
ROUNDED_BOUND = re.compile(r"Input should be (?:less|greater) than or equal to (-?\d+)")
DOUBLE_EXACT = 2**53


def unstatable(status: int, content: bytes) -> str | None:
    """The rule a 400 refused a body for, when it is one of UNSTATABLE (or a bound schemathesis
    rounded); else None."""
    if status != 400:
        return None
    try:
        body: Any = json.loads(content)
        message = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return None
    bound = ROUNDED_BOUND.search(message)
    if bound is not None and abs(int(bound.group(1))) > DOUBLE_EXACT:
        return "a bound past 2**53, which schemathesis compares as a double"
    return next((why for fragment, why in UNSTATABLE.items() if fragment in message), None)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but a schema-valid body's 400 for a rule of UNSTATABLE."""
    if not isinstance(failure, RejectedPositiveData):
        return True
    return unstatable(response.status_code, response.content) is None
