"""Token and sequence counts as users type them: '4096', or '8k' (a k is 1024 tokens, as model
cards count context). One parser for budget's, pull's and every model command's flags."""

from __future__ import annotations

import argparse
import re

from localinfer.errors import InvalidParameterError

_COUNT = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


def _count(text: str) -> int | None:
    """The count ``text`` spells (0 included), or None when it spells none."""
    match = _COUNT.match(text)
    return int(match.group(1)) * (1024 if match.group(2) else 1) if match else None


def parse_count(text: str, flag: str) -> int:
    """'4096' -> 4096, '8k' -> 8192; InvalidParameterError naming ``flag`` otherwise."""
    value = _count(text)
    if value is None:
        raise InvalidParameterError(f"{flag} wants a whole number like 4096 or 8k, got '{text}'")
    if value < 1:
        raise InvalidParameterError(f"{flag} must be at least 1, got '{text}'")
    return value


def count_arg(text: str) -> int:
    """argparse ``type=`` for a count flag ('4096', '8k'): a usage error when it is not one."""
    value = _count(text) or 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a count of at least 1 like 4096 or 8k: '{text}'")
    return value


def positive_int_arg(text: str) -> int:
    """argparse ``type=`` for a plain whole number of at least 1 (--threads)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number of at least 1, got '{text}'")
    return value
