"""The shape a model id from a request must have before anything looks it up beyond the names
already served.

A request's ``model`` (or the id in /v1/models/{id}) is matched against the served names first
(``ModelPool.find_known``). Only an id that matches none goes on to the supply, which may try it
as a file (``--models-from local``) or in the Hugging Face cache; before that it must be a
plausible name: not longer than a path may be, and free of characters no model is named with
(controls such as NUL and invisible marks such as right-to-left overrides, which also make a
logged name read as another). ``ModelId`` carries the rule into the request bodies and so into
/openapi.json; ``check_model_id`` applies it to whatever reaches the pool. Anything else is
left to resolution, which treats a name that no path can be (an unknown ``~user``, a part
longer than a file name) as no path: such an id is simply not served, a 404.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from localinfer.server.errors import APIError

# Paths are the longest ids a server takes (--models-from local); PATH_MAX is 1024 on macOS.
MAX_ID_CHARS = 1024
# C0 and C1 controls (NUL, tab, newline, DEL...), zero-width and bidi marks (U+200B..U+200F,
# U+202A..U+202E embeddings and overrides, U+2066..U+2069 isolates), the line and paragraph
# separators, word joiners and the BOM. Written as escapes for every regex dialect that reads
# it: Python's, pydantic's (Rust) and the ECMA one JSON Schema names.
REFUSED = r"\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
MODEL_ID_PATTERN = rf"^[^{REFUSED}]*$"
_REFUSED_CHAR = re.compile(rf"[{REFUSED}]")
SHOWN_CHARS = 40  # of a refused id, in its error message


def model_id_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model id, or None when it may be one."""
    if len(name) > MAX_ID_CHARS:
        return f"{len(name)} characters, more than a model id may have ({MAX_ID_CHARS})"
    refused = _REFUSED_CHAR.search(name)
    if refused is not None:
        char = refused.group()
        return f"character {refused.start()} is U+{ord(char):04X}, a control or invisible mark"
    return None


def _plausible(name: str) -> str:
    problem = model_id_problem(name)
    if problem is not None:
        raise ValueError(f"not a model id: {problem}")
    return name


# A model id as a request body may give it (null or "": the default model). The length and
# pattern are documented as the ones the validator applies: pydantic's own pattern error names
# no character, and its max_length refuses a lone surrogate (JSON's "\udc00") as no string at
# all, where the id is simply not served (a 404 that echoes it escaped).
ModelId = Annotated[
    str,
    Field(json_schema_extra={"maxLength": MAX_ID_CHARS, "pattern": MODEL_ID_PATTERN}),
    AfterValidator(_plausible),
]


def check_model_id(name: str) -> None:
    """A 400 naming ``model`` when ``name`` cannot be a model id."""
    problem = model_id_problem(name)
    if problem is not None:
        shown = name[:SHOWN_CHARS] + ("..." if len(name) > SHOWN_CHARS else "")
        raise APIError(
            400,
            f"model: {ascii(shown)} is not a model id: {problem}",
            code="invalid_model_id",
            param="model",
        )
