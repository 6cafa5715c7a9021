"""Tool-call families: which syntax a model was trained to call tools with, read from its chat
template, and the ids its calls carry.

* HERMES — ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen 2.5/3, Hermes 2/3,
  Granite, MiMo, ...);
* LLAMA3 — the whole answer is ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>`` (Llama 3.1/3.2/3.3);
* MISTRAL — ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``, or
  ``[TOOL_CALLS]name[ARGS]{...}`` in the newer tokenizers (Nemo, Small 3.x, Devstral);
* HARMONY — gpt-oss: a message on the commentary channel addressed to the function,
  ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``
  (harmony_calls.py);
* GENERIC — a template without tool support, or one whose call syntax is not parsed here: the
  tools are described in a system prompt (prompt.py) and calls read with the HERMES syntax.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from dataclasses import dataclass
from enum import StrEnum


class ToolFamily(StrEnum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    HARMONY = "harmony"
    GENERIC = "generic"


@dataclass(frozen=True)
class ToolCall:
    """One call as OpenAI returns it: ``arguments`` is JSON text of an object."""

    id: str
    name: str
    arguments: str


# Call syntaxes built of XML-like tags per argument (GLM, Qwen3-Coder, Nemotron, Seed-OSS,
# functionary): their templates also say <tool_call> or <|python_tag|>, but their calls are not
# JSON. They get the generic prompt, which these parsers can read.
_XML_ARGUMENT_MARKERS = ("<arg_key>", "<parameter=", "<function=")
_JSON_NAME_KEY = re.compile(r'\\?"name\\?"')

_ALPHANUMERIC = string.ascii_letters + string.digits
_MISTRAL_ID = re.compile(r"[a-zA-Z0-9]{9}")


def detect_family(template_source: str | None) -> ToolFamily:
    """The family of a chat template's tool-call syntax (GENERIC when it has none we parse)."""
    if not template_source:
        return ToolFamily.GENERIC
    if "<|channel|>commentary" in template_source and "<|call|>" in template_source:
        return ToolFamily.HARMONY
    if any(marker in template_source for marker in _XML_ARGUMENT_MARKERS):
        return ToolFamily.GENERIC
    if "<tool_call>" in template_source and _JSON_NAME_KEY.search(template_source):
        return ToolFamily.HERMES
    if "[TOOL_CALLS]" in template_source:
        return ToolFamily.MISTRAL
    if "<|python_tag|>" in template_source or "ipython" in template_source:
        return ToolFamily.LLAMA3
    return ToolFamily.GENERIC


def new_call_id(family: ToolFamily) -> str:
    """A fresh call id: ``call_`` and 24 hex digits, or for MISTRAL exactly 9 alphanumerics
    (Mistral's templates raise on any other id when the call comes back in the history)."""
    if family == ToolFamily.MISTRAL:
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def template_call_id(call_id: str, family: ToolFamily) -> str:
    """The id a history's call carries into the template. Mistral's templates need 9
    alphanumerics; an id from elsewhere (``call_...``) is mapped to 9 derived from its hash, the
    same for the call and its result."""
    if family != ToolFamily.MISTRAL or _MISTRAL_ID.fullmatch(call_id):
        return call_id
    digest = int.from_bytes(hashlib.sha256(call_id.encode("utf-8", "replace")).digest(), "big")
    chars = []
    for _ in range(9):
        digest, rest = divmod(digest, len(_ALPHANUMERIC))
        chars.append(_ALPHANUMERIC[rest])
    return "".join(chars)
