"""JSON schemas with a question each, answered by the embedded model under constraint: the
structured-output benchmark's workload (scripts/bench-structured) and the validity test's
(tests/test_structured_generation.py). Objects, required and optional fields, enums, const,
arrays, nesting, anyOf, nullable types, string formats and lengths, patterns, numbers with bounds,
$defs references and a tool call's arguments.

Numbers have bounds and lists a maximum length: unbounded, SmolLM2-135M can repeat a digit or an
item until max_tokens (a population of 1111..., a latitude of 48.2333...), which no constraint
forbids.
"""

from __future__ import annotations

import json
from typing import Any


def obj(**properties: Any) -> dict[str, Any]:
    """OpenAI's strict form: every property required, no others."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def text(max_length: int = 40) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def array(items: dict[str, Any], most: int = 5, least: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": least, "maxItems": most}


INT, NUM, BOOL = ({"type": t} for t in ("integer", "number", "boolean"))
# (the question, the schema the answer must follow)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "person": ("Describe a person.", obj(name=text(), age=INT)),
    "city": (
        "Describe Paris.",
        obj(city=text(), country=text(), population={**INT, "minimum": 0, "maximum": 10**8}),
    ),
    "flags": ("Is water wet? Is fire cold?", obj(water_wet=BOOL, fire_cold=BOOL)),
    "score": ("Rate this movie from 0 to 10.", obj(score={**NUM, "minimum": 0, "maximum": 10})),
    "percent": (
        "What share of Earth is ocean, in percent?",
        obj(percent={"type": "integer", "minimum": 0, "maximum": 100}),
    ),
    "enum": (
        "What color is the sky?",
        obj(color={"type": "string", "enum": ["red", "green", "blue"]}),
    ),
    "int-enum": ("Pick a level.", obj(level={"enum": [1, 2, 3]})),
    "const": ("Log an event.", obj(kind={"const": "event"}, count=INT)),
    "tags": ("Give tags for a cat photo.", obj(tags=array(text(15), most=4, least=1))),
    "numbers": ("List a few prime numbers.", obj(primes=array(INT, most=6, least=2))),
    "pair": (
        "Give a point on a grid.",
        obj(point={"type": "array", "items": INT, "minItems": 2, "maxItems": 2}),
    ),
    "objects": (
        "List two fruits with their prices.",
        obj(items=array(obj(name=text(20), price=NUM), most=3, least=1)),
    ),
    "nested": (
        "Describe a user and where they live.",
        obj(user=obj(name=text(), address=obj(city=text(), zip=text(10)))),
    ),
    "deep": ("Nest a number.", obj(a=obj(b=obj(c=obj(d=INT))))),
    "anyOf-scalar": (
        "Give a value.",
        obj(value={"anyOf": [text(20), INT, {"type": "null"}]}),
    ),
    "anyOf-objects": (
        "Divide 10 by 2.",
        obj(result={"anyOf": [obj(value=NUM), obj(error=text())]}),
    ),
    "nullable": (
        "Where is the treasure?",
        # multipleOf bounds the decimals (0.5: exact in binary, as jsonschema checks it)
        obj(
            latitude={"type": ["number", "null"], "minimum": -90, "maximum": 90, "multipleOf": 0.5}
        ),
    ),
    "date": ("When did the moon landing happen?", obj(day={"type": "string", "format": "date"})),
    "date-time": (
        "When is the meeting?",
        obj(when={"type": "string", "format": "date-time"}),
    ),
    "email": (
        "Give a contact address.",
        obj(email={"type": "string", "format": "email", "maxLength": 40}),
    ),
    "uuid": ("Make an identifier.", obj(id={"type": "string", "format": "uuid"})),
    "pattern": (
        "Give a phone number.",
        obj(phone={"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}),
    ),
    "length": (
        "Give a short code.",
        obj(code={"type": "string", "minLength": 3, "maxLength": 5}),
    ),
    "optional": (
        "Describe a book.",
        {
            "type": "object",
            "properties": {"title": text(), "pages": INT},
            "required": ["title"],
            "additionalProperties": False,
        },
    ),
    "tool-call": (
        "What's the weather in Berlin for 3 days?",
        obj(
            location=text(),
            unit={"type": "string", "enum": ["celsius", "fahrenheit"]},
            days={"type": "integer", "minimum": 1, "maximum": 14},
        ),
    ),
    "defs-ref": (
        "List two tasks.",
        {
            **obj(tasks=array({"$ref": "#/$defs/task"}, most=3, least=1)),
            "$defs": {"task": obj(title=text(30), done=BOOL)},
        },
    ),
}


def prompt_text(question: str, schema: dict[str, Any]) -> str:
    """The user message: the question and the schema it is to be answered in."""
    return f"{question} Answer in JSON following this schema: {json.dumps(schema)}"
