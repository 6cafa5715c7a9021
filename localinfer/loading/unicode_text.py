"""Text from users may hold lone UTF-16 surrogates; here they become U+FFFD before any codec sees
them.

JSON allows ``"\\ud800"`` on its own, and Python hands argv bytes that are not UTF-8 to the program
as surrogateescape'd ``\\udc80``-``\\udcff`` characters. Neither can be encoded as UTF-8, so
``tokenizers``, the HTTP response writer and ``print`` all fail on them. Replacing them once, where
text enters the tokenizer, the chat template and the stop strings, covers every caller.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogates(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def scrub_surrogates(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD; a high+low pair (two code units
    from a UTF-16 source) becomes the character it encodes. Clean text is returned as is."""
    if not has_surrogates(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
