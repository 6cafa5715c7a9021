"""What a request asks its answer to match: a JSON object, a JSON Schema, a regex or a grammar."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from localinfer.errors import InvalidParameterError

ConstraintKind = Literal["json_object", "json_schema", "regex", "grammar"]
KINDS: tuple[str, ...] = get_args(ConstraintKind)


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """One constraint as the request gave it.

    ``source`` is the JSON Schema (a dict, or its JSON text) for ``json_schema``, the pattern for
    ``regex``, the grammar text (Lark, or llama.cpp's GBNF) for ``grammar``; ``json_object`` takes
    none. ``field`` names the request field the source came from, so errors can name it.
    ``compact`` JSON has no whitespace but the one space after each ``,`` and ``:`` (forced tool
    calls, strict schemas); otherwise a short run of whitespace may sit between JSON tokens.
    """

    kind: ConstraintKind
    source: str | dict[str, Any] = ""
    field: str = "response_format"
    compact: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(
                f"{self.field}: unknown constraint kind {self.kind!r} (expected one of "
                f"{', '.join(KINDS)})"
            )
        if self.kind == "json_schema":
            self.schema()  # parse now: a bad schema text is the caller's error, not a 500
        elif self.kind in ("regex", "grammar") and not (
            isinstance(self.source, str) and self.source.strip()
        ):
            raise InvalidParameterError(f"{self.field}: a {self.kind} needs non-empty text")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema as a dict (``json_schema`` only)."""
        source = self.source
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except json.JSONDecodeError as exc:
                raise InvalidParameterError(
                    f"{self.field}: the JSON schema is not valid JSON ({exc})"
                ) from None
        if not isinstance(source, dict):
            raise InvalidParameterError(
                f"{self.field}: a JSON schema must be an object, not {type(source).__name__}"
            )
        return source
