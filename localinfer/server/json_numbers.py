"""Integers in request bodies as JSON Schema counts them: ``1.0`` is the integer 1.

JSON has one number type, and JSON Schema's ``integer`` is any number with no fractional part,
so a client (or a JavaScript one, whose numbers are all doubles) may send ``"max_tokens": 1.0``
and the document says it is valid. pydantic's strict int refuses it, and its lax int also takes
``"1"`` and ``true``, which the document says are not integers. ``JsonInt`` takes the middle way:
an integral float becomes its int, then the strict check refuses strings, booleans and
fractions as before.

The bounds live in ``JsonInt`` itself, not in ``Field(ge=...)``: pydantic applies a field's
bounds after a converting validator as a separate step whose JSON schema it writes as ``"ge"``
rather than ``"minimum"``, which no JSON Schema reader knows; bounds inside the int schema keep
the document's ``minimum``/``maximum``.

    max_tokens: Annotated[int, JsonInt(ge=1)] | None = None
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema


def _integral(value: Any) -> Any:
    """An integral float as its int (1.0 -> 1); anything else untouched, for the int check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass(frozen=True, slots=True)
class JsonInt:
    """``Annotated[int, JsonInt(ge=..., le=...)]``: a JSON Schema integer within the bounds."""

    ge: int | None = None
    le: int | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        strict = core_schema.int_schema(strict=True, ge=self.ge, le=self.le)
        return core_schema.no_info_before_validator_function(_integral, strict)


# An integer with no bounds.
Integer = Annotated[int, JsonInt()]
