"""Compile a ConstraintSpec for one vocabulary with llguidance (the engine chosen in issue #20:
scripts/compare-grammar-engines measured 0.4 ms compiles and 11/127 us p50/p99 masks on
SmolLM2's 49,152 tokens, with no dependencies).

Build one ConstraintCompiler per loaded model (indexing the vocabulary takes ~0.2 s); compile
each request's spec (well under a millisecond for OpenAI-style schemas: llguidance builds lexer
states lazily while masking) and start a TokenConstraint per sequence from the result.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import llguidance

from localinfer.constraints.spec import ConstraintSpec
from localinfer.constraints.token_constraint import TokenConstraint
from localinfer.constraints.vocabulary import ConstraintVocabulary
from localinfer.errors import InvalidParameterError

# Whitespace between JSON tokens as models write it, but bounded: an unbounded run lets a small
# model loop on newlines until max_tokens.
JSON_OPTIONS: dict[str, Any] = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{1,16}"}
# Compact JSON (ConstraintSpec.compact): no whitespace but the one space json.dumps writes after
# "," and ":", which models have seen most (xgrammar's any_whitespace=False writes the same).
# Even 16 characters a gap let a small model at temperature 1 spend a forced call's max_tokens
# on newlines between the tokens of "[{"name": ...", so a call the client is waiting for does
# not fit.
COMPACT_JSON: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
LENIENT: dict[str, Any] = {**JSON_OPTIONS, "lenient": True}


class CompiledConstraint:
    """A compiled grammar; ``start()`` gives each sequence its own matcher (a cheap copy)."""

    def __init__(self, matcher: llguidance.LLMatcher, spec: ConstraintSpec, vocab_size: int):
        self._matcher = matcher
        self.spec = spec
        self.vocab_size = vocab_size

    def start(self) -> TokenConstraint:
        return TokenConstraint(self._matcher.deep_copy(), self.vocab_size)


class ConstraintCompiler:
    """Compiles specs against one model's vocabulary."""

    def __init__(self, vocabulary: ConstraintVocabulary) -> None:
        self.vocabulary = vocabulary
        self._tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Wrapper(vocabulary)),
            n_vocab=vocabulary.size,
            eos_token=list(vocabulary.eos_ids),
        )

    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Raises InvalidParameterError naming the request field when the source is not one
        the engine can build (a malformed schema, regex or grammar, or an unsupported
        keyword)."""
        grammar = _grammar_text(spec)
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidParameterError(
                f"{spec.field}: {_one_line(matcher.get_error(), spec.kind)}"
            )
        if _admits_nothing(matcher):
            raise InvalidParameterError(f"{spec.field}: the constraint admits no answer at all")
        return CompiledConstraint(matcher, spec, self.vocabulary.size)


def _admits_nothing(matcher: llguidance.LLMatcher) -> bool:
    """Whether no answer can ever be written: a schema whose only definition is itself
    ({"$ref": "#/$defs/a"} with a: {"$ref": "#/$defs/a"}) would otherwise give an empty "JSON"
    answer ending with "stop". llguidance finds out while computing the first mask (on a
    copy: the compiled matcher stays as built)."""
    probe = matcher.deep_copy()
    probe.compute_bitmask()
    return probe.is_stopped() and not probe.is_accepting()


class _Wrapper:
    """llguidance's TokenizerWrapper protocol; special tokens are marked by a leading 0xff byte,
    so no grammar can spell them out as text."""

    def __init__(self, vocabulary: ConstraintVocabulary) -> None:
        self.eos_token_id = vocabulary.eos_ids[0]
        self.bos_token_id = None
        self.tokens = [
            b"\xff" + t if i in vocabulary.special_ids else t
            for i, t in enumerate(vocabulary.tokens)
        ]
        self.special_token_ids = sorted(vocabulary.special_ids)
        self._encode = vocabulary.encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._encode(text)


@lru_cache(maxsize=256)
def _schema_problem(schema_json: str) -> str | None:
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_json, defaults=LENIENT)
    except Exception as exc:  # the converter raises ValueError or its own error classes
        return str(exc)
    return llguidance.LLMatcher.validate_grammar(grammar, None) or None


def json_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is broken (one line), or None: for schemas a request carries but may never
    constrain with (a tool's parameters under tool_choice "auto"). Lenient: keywords llguidance
    does not implement (uniqueItems, not, if/then, unknown formats: common in agents' tool
    lists) pass, as they did before; an unknown type or a pattern that is not a regex does not.
    A forced call still compiles strictly and names tool_choice. Cached: agents send the same
    tools every turn."""
    problem = _schema_problem(json.dumps(schema, sort_keys=True))
    if problem is None:
        return None
    return _one_line(problem, "json_schema")


def _grammar_text(spec: ConstraintSpec) -> str:
    """The llguidance grammar for a spec; errors in the source surface as InvalidParameterError."""
    try:
        if spec.kind in ("json_object", "json_schema"):
            schema = ANY_JSON_OBJECT if spec.kind == "json_object" else spec.schema()
            options = COMPACT_JSON if spec.compact else JSON_OPTIONS
            return llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults=options
            )
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(str(spec.source))
        # "grammar" takes Lark, or llama.cpp's GBNF (converted to Lark).
        return llguidance.grammar_from("grammar", str(spec.source))
    except InvalidParameterError:
        raise
    except Exception as exc:  # the converters raise ValueError or their own error classes
        raise InvalidParameterError(f"{spec.field}: {_one_line(str(exc), spec.kind)}") from None


def _one_line(message: str, kind: str) -> str:
    """llguidance's error as one line: its first line, plus the parser's own ``error:`` line
    when the first only announces it (a regex's "regex parse error:"). Positions ("at 1(8)")
    point into the grammar llguidance built, so they are kept for grammars only."""
    lines = [line.strip() for line in message.strip().splitlines()]
    if not lines:
        return "invalid constraint"
    first = lines[0]
    if kind != "grammar":
        first = re.sub(r"^at \d+\(\d+\): ", "", first)
    detail = next((line for line in lines[1:] if line.startswith("error: ")), None)
    if first.endswith(":") and detail is not None:
        first = f"{first} {detail.removeprefix('error: ')}"
    return first
