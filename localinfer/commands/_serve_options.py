"""``serve``'s flags for what a request may ask of the server beyond the model: a chat past the
context (``--context-overflow``, localinfer/server/overflow.py) and image URLs fetched for it
(``--allow-image-urls``, localinfer/server/image_fetch.py)."""

from __future__ import annotations

import argparse
from typing import Any

# image_fetch.OPTION_VALUES, not imported here: every command registers its flags at start-up,
# and the server pulls in FastAPI.
IMAGE_URL_VALUES = ("public", "private")


def add_request_options(p: Any) -> None:
    p.add_argument(
        "--context-overflow", choices=("stop", "drop-oldest"), default="stop",
        help="a chat past the context: refused with context_length_exceeded (stop, OpenAI's "
        "way; default) or answered without its oldest whole turns (drop-oldest; the response "
        "says how many in X-Context-Dropped-Messages and usage.dropped_messages)",
    )  # fmt: skip
    p.add_argument(
        "--allow-image-urls", nargs="?", const="public", type=_image_urls, metavar="private",
        help="fetch an image part's http(s) URL (default: refused; send images inline). At most "
        "20 MiB in 10 s and 3 redirects, from public addresses only; "
        "--allow-image-urls=private also fetches loopback, private and link-local ones",
    )  # fmt: skip


def _image_urls(text: str) -> str:
    if text in IMAGE_URL_VALUES:
        return text
    # The flag takes an optional value, so a MODEL written right after it lands here.
    raise argparse.ArgumentTypeError(
        f"{text!r} is not public or private (to name a model after this flag, write "
        "--allow-image-urls=public, or put the flag after the model)"
    )
