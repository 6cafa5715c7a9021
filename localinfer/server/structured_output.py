"""``response_format`` -> the constraint an answer must match (OpenAI's structured outputs).

``text`` asks for nothing; ``json_object`` for any JSON object; ``json_schema`` for an answer
that validates against ``json_schema.schema``. OpenAI's ``strict`` flag is accepted either way:
the engine's constraint always enforces the whole schema, so the answer parses and validates
whether or not the client asked for strictness. Each mistake is a 400 naming its field.
"""

from __future__ import annotations

import re
from typing import Any

from localinfer.constraints import ConstraintSpec
from localinfer.server.errors import APIError

# OpenAI's rule for json_schema.name.
SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", code="invalid_parameter", param=param)


def response_format_spec(response_format: dict[str, Any] | None) -> ConstraintSpec | None:
    """The constraint ``response_format`` asks for, None for plain text."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object", field="response_format")
    if kind != "json_schema":
        raise _bad(
            "response_format.type",
            f"{kind!r} is not one of 'text', 'json_object', 'json_schema'",
        )
    wrapper = response_format.get("json_schema")
    if not isinstance(wrapper, dict):
        raise _bad("response_format.json_schema", "an object with 'name' and 'schema' is needed")
    name = wrapper.get("name")
    if name is not None and not (isinstance(name, str) and SCHEMA_NAME.match(name)):
        raise _bad("response_format.json_schema.name", "must match ^[a-zA-Z0-9_-]{1,64}$")
    strict = wrapper.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad("response_format.json_schema.strict", "must be true or false")
    schema = wrapper.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise _bad("response_format.json_schema.schema", "a JSON schema must be an object")
    return ConstraintSpec("json_schema", source=schema, field="response_format.json_schema.schema")
