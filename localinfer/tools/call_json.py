"""Reading one call out of JSON a model wrote, strictly: a call is only a call when it names an
offered tool and its arguments are a JSON object; anything else is left as text by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

_DECODER = json.JSONDecoder(parse_constant=lambda name: _refuse(name))


def _refuse(name: str) -> Any:
    # NaN / Infinity are not JSON; a client parsing the arguments would choke on them.
    raise ValueError(f"{name} is not valid JSON")


@dataclass(frozen=True)
class CallText:
    """A call read from model output, before it gets an id."""

    name: str
    arguments: str


def loads(text: str) -> Any:
    """``json.loads`` without NaN/Infinity; raises ValueError."""
    return _DECODER.decode(text)


def decode_at(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON value starting at ``text[start]`` and the index just past it, or None when there
    is none (yet): the text may be cut short or not JSON."""
    try:
        return _DECODER.raw_decode(text, start)
    except ValueError:
        return None


def arguments_text(arguments: dict[str, Any]) -> str:
    """Arguments as OpenAI sends them: compact JSON, non-ASCII kept."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def read_arguments(value: object) -> dict[str, Any] | None:
    """Arguments given as an object, or as JSON text of one (some models quote them)."""
    if isinstance(value, str):
        try:
            value = loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def read_call(
    value: object,
    tools: Collection[str],
    *,
    require_arguments: bool = False,
    allowed_keys: Collection[str] | None = None,
) -> CallText | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` as a call of one of ``tools``, or None.

    ``require_arguments``: a call without arguments is not one (for syntaxes without a marker,
    where a JSON answer might only happen to have a "name"). ``allowed_keys``: any other key
    means this is not a call.
    """
    if not isinstance(value, dict):
        return None
    if allowed_keys is not None and not set(value) <= set(allowed_keys):
        return None
    name = value.get("name")
    if not isinstance(name, str) or name not in tools:
        return None
    key = "arguments" if "arguments" in value else "parameters"
    if key not in value:
        if require_arguments:
            return None
        return CallText(name, "{}")
    arguments = read_arguments(value[key])
    if arguments is None:
        return None
    return CallText(name, arguments_text(arguments))
