"""``response_format`` -> the constraint an answer must match (OpenAI's structured outputs).

``text`` (or no type) asks for nothing; ``json_object`` for any JSON object; ``json_schema`` for
an answer that validates against ``json_schema.schema``. The engine's constraint always enforces
the whole schema, so the answer parses and validates whether or not the client asked for
strictness; OpenAI's ``strict: true`` also makes it compact JSON (one space after ``,`` and
``:``, no newlines), otherwise short runs of whitespace between tokens are allowed. The body's
model refuses a malformed format, naming its field; a schema the constraint engine cannot build
is a 400 naming it too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from localinfer.constraints import ConstraintSpec

# OpenAI's rule for json_schema.name.
SCHEMA_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
# A json_schema format needs its schema; the document says so (schemas.SamplingFields checks).
NEEDS_SCHEMA: dict[str, Any] = {
    "if": {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]},
    "then": {"properties": {"json_schema": {"type": "object"}}, "required": ["json_schema"]},
}


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the answer must match, and its name."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str | None = Field(default=None, pattern=SCHEMA_NAME)
    description: str | None = None
    # "schema" would shadow BaseModel.schema; the JSON key stays "schema". Left out: any object.
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """Chat and text completions' ``response_format``."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=NEEDS_SCHEMA)

    type: Literal["text", "json_object", "json_schema"] | None = None
    json_schema: JsonSchemaFormat | None = None


def response_format_spec(response_format: ResponseFormat | None) -> ConstraintSpec | None:
    """The constraint ``response_format`` asks for, None for plain text."""
    if response_format is None or response_format.type in (None, "text"):
        return None
    if response_format.type == "json_object":
        return ConstraintSpec("json_object", field="response_format")
    wrapper = response_format.json_schema
    assert wrapper is not None  # SamplingFields refused a json_schema format without it
    return ConstraintSpec(
        "json_schema",
        source=wrapper.schema_,
        field="response_format.json_schema.schema",
        compact=wrapper.strict is True,
    )
