"""Prompts with images, as the front ends make them (issue #37).

A front end writes :data:`IMAGE_MARKER` where each image goes in the prompt's text (a chat
template renders it like any text), decodes the pictures into :class:`RGBImage`, and asks the
runner's projector for the prompt (:func:`image_prompt`): token ids with each image's placeholder
ids, and the images, which go on the engine ``Request`` together. The types come from the Runner
seam (backends/prompt_images.py), re-exported here so the front ends need no backend module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from localinfer.backends.base import prompt_images
from localinfer.engine.request_checks import IMAGES_NEED
from localinfer.errors import InvalidParameterError, UnsupportedModelError

IMAGE_MARKER = prompt_images.IMAGE_MARKER
ImagePrompt = prompt_images.ImagePrompt
PromptImage = prompt_images.PromptImage
RGBImage = prompt_images.RGBImage
runner_vision = prompt_images.runner_vision

__all__ = [
    "IMAGE_MARKER",
    "ImagePrompt",
    "PromptImage",
    "RGBImage",
    "image_prompt",
    "reads_images",
]


def reads_images(runner: object) -> bool:
    """Whether ``runner`` has a vision projector loaded."""
    return runner_vision(runner) is not None


def image_prompt(
    runner: object, tokenizer: Any, text: str, images: Sequence[RGBImage], field: str = "prompt"
) -> ImagePrompt:
    """``text`` (with IMAGE_MARKER where each image goes) tokenized by ``runner``'s projector,
    with BOS first when the model wants one and the text did not write it (as a chat prompt
    gets it). UnsupportedModelError when the runner reads no images; InvalidParameterError
    naming ``field`` when the markers and the images do not pair up."""
    vision = runner_vision(runner)
    if vision is None:
        raise UnsupportedModelError(IMAGES_NEED)
    try:
        prompt = vision.prompt(text, images, None)
    except ValueError as exc:
        raise InvalidParameterError(f"{field}: {exc}") from None
    bos = getattr(tokenizer, "bos_id", None)
    if not getattr(tokenizer, "add_bos", False) or bos is None or prompt.ids[:1] == [bos]:
        return prompt
    shifted = tuple(dataclasses.replace(i, start=i.start + 1) for i in prompt.images)
    return ImagePrompt([bos, *prompt.ids], shifted)
