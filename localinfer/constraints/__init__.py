"""Constrained decoding: a per-sequence token constraint from a JSON object, JSON Schema, regex or
grammar request, over the model's vocabulary. Framework-free (numpy bitmasks); the engine applies
the masks to its logits.

The compiler needs the optional dependency llguidance; it is imported on first use of
``ConstraintCompiler``/``CompiledConstraint``/``TokenConstraint``, so specs can be checked and
unconstrained requests served without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from localinfer.constraints.bitmask import allocate_bitmask, apply_bitmask, bitmask_to_bool
from localinfer.constraints.spec import ConstraintKind, ConstraintSpec
from localinfer.constraints.vocabulary import ConstraintVocabulary, vocabulary_from_tokenizer

if TYPE_CHECKING:
    from localinfer.constraints.compiler import CompiledConstraint, ConstraintCompiler
    from localinfer.constraints.token_constraint import TokenConstraint, TokenRefusedError

_LAZY = {
    "CompiledConstraint": "localinfer.constraints.compiler",
    "ConstraintCompiler": "localinfer.constraints.compiler",
    "TokenConstraint": "localinfer.constraints.token_constraint",
    "TokenRefusedError": "localinfer.constraints.token_constraint",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CompiledConstraint",
    "ConstraintCompiler",
    "ConstraintKind",
    "ConstraintSpec",
    "ConstraintVocabulary",
    "TokenConstraint",
    "TokenRefusedError",
    "allocate_bitmask",
    "apply_bitmask",
    "bitmask_to_bool",
    "vocabulary_from_tokenizer",
]
