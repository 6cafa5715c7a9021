"""A request's checks before it is queued: the engine refuses what it cannot run whole, with the
field named, so no compute is spent on it and nothing is ever truncated."""

from __future__ import annotations

from collections.abc import Sequence

from localinfer.backends.base import prompt_images
from localinfer.engine.types import Request
from localinfer.errors import ContextOverflowError, InvalidParameterError, UnsupportedModelError

WRITES_NO_TEXT = (
    "this model generates no text: it is an encoder (a BERT reranker scores query-document "
    "pairs through /v1/rerank or `localinfer rerank`)"
)
IMAGES_NEED = (
    "this model reads no images here: images need its vision projector (an mmproj*.gguf beside "
    "the GGUF, or --mmproj FILE) on the llama.cpp runner (--backend llamacpp)"
)


def check_request(request: Request, vocab_size: int, max_ctx: int, runner: object = None) -> None:
    """Raises InvalidParameterError or ContextOverflowError for a request the engine cannot run
    (UnsupportedModelError for images, unless ``runner`` reads them: ``runner.vision``, and for
    any request to a runner that writes no text: ``runner.generates_text`` False)."""
    if getattr(runner, "generates_text", True) is False:
        raise UnsupportedModelError(WRITES_NO_TEXT)
    ids = request.prompt_ids
    if not ids:
        raise InvalidParameterError("the prompt has no tokens")
    if request.images:
        if prompt_images.runner_vision(runner) is None:
            raise UnsupportedModelError(IMAGES_NEED)
        try:
            prompt_images.check_images(ids, request.images)
        except ValueError as exc:
            raise InvalidParameterError(f"prompt: {exc}") from None
    _check_ids("prompt", text_ids(request), vocab_size)
    # The prompt plus one generated token must fit; nothing is ever truncated.
    if len(ids) + 1 > max_ctx:
        raise ContextOverflowError(
            requested=len(ids) + 1,
            limit=max_ctx,
            what=f"the prompt ({len(ids)} tokens) plus one new token",
        )
    _check_ids("stop_token_ids", request.params.stop_token_ids, vocab_size)


def text_ids(request: Request) -> list[int]:
    """The prompt's ids without its images' placeholders (the sampler's seen tokens)."""
    ids = request.prompt_ids
    return [t for t in ids if not prompt_images.is_image_id(t)] if request.images else ids


def _check_ids(field: str, ids: Sequence[int], vocab_size: int) -> None:
    bad = next((t for t in ids if not (0 <= int(t) < vocab_size)), None)
    if bad is not None:
        within = f"0..{vocab_size - 1}"
        raise InvalidParameterError(f"{field}: token id {bad} is outside the vocabulary ({within})")
