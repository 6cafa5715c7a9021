"""OpenAI request bodies -> engine Requests: prompt token ids and SamplingParams.

Everything a client can get wrong is caught here or by the engine's own checks, before any
compute, and becomes an APIError (400) that names the parameter; a model that cannot serve the
request (no FIM tokens for a ``suffix``) is a 404 (``capability``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from localinfer.engine.types import SamplingParams
from localinfer.errors import ContextOverflowError
from localinfer.fim import FIM_EXAMPLE_MODEL, FIM_FAMILIES, find_fim_format
from localinfer.loading.unicode_text import scrub_surrogates
from localinfer.server.capability import model_cannot
from localinfer.server.errors import APIError
from localinfer.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

# OpenAI's default when a request leaves temperature out.
DEFAULT_TEMPERATURE = 1.0


if TYPE_CHECKING:
    from localinfer.loading.model import LoadedModel


class PromptSource(Protocol):
    """What translation needs from a session (localinfer.session.Session fits)."""

    @property
    def model(self) -> LoadedModel: ...

    def raw_prompt_ids(self, text: str) -> list[int]: ...


@dataclass(slots=True, frozen=True)
class CompletionPrompt:
    """A text completion's prompt, as the engine takes it."""

    ids: list[int]
    text: str  # the prompt's text, for echo ("" for token ids); surrogates replaced
    stop_token_ids: tuple[int, ...] = ()  # fill-in-the-middle: the tokens that end a middle


def bad_param(param: str, message: str, code: str = "invalid_parameter") -> APIError:
    return APIError(400, message, code=code, param=param)


def check_chat(body: ChatCompletionRequest) -> int | None:
    """The top-N logprobs a chat completion wants (None: off). What it cannot do (n > 1, a
    logit_bias, top_logprobs without logprobs...) the body's own model refused (schemas)."""
    if not body.logprobs:
        return None
    return body.top_logprobs or 0


def check_completion(body: CompletionRequest) -> int | None:
    """The top-N logprobs a text completion wants (None: off); its body's model refused n or
    best_of > 1, a logit_bias, echo with logprobs, and a suffix with token ids."""
    return body.logprobs


def completion_prompt(
    source: PromptSource, body: CompletionRequest, model: str | None = None
) -> CompletionPrompt:
    """The prompt's token ids, and its text. With ``suffix`` (an empty one too) it is a
    fill-in-the-middle prompt in the format of the model's FIM tokens (``localinfer.fim``;
    a 404 naming ``model`` when it has none: ``no_fim``), the prompt being the text before the
    cursor."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if not prompt:
            raise bad_param("prompt", "the prompt is empty")
        if all(isinstance(t, int) for t in prompt):
            return CompletionPrompt([int(t) for t in prompt], "")  # type: ignore[arg-type]
        if len(prompt) != 1:
            raise bad_param(
                "prompt", "send one prompt per request (a list of prompts is not supported)"
            )
        first = prompt[0]
        if isinstance(first, list):
            return CompletionPrompt([int(t) for t in first], "")
        prompt = first
    if body.suffix is not None:
        tokenizer = source.model.tokenizer
        fim = find_fim_format(tokenizer)
        if fim is None:
            raise no_fim(model or source.model.name)
        ids = fim.prompt_ids(tokenizer, prompt, body.suffix)
        return CompletionPrompt(ids, scrub_surrogates(prompt), fim.stop_ids)
    if not prompt:
        raise bad_param("prompt", "the prompt is empty")
    return CompletionPrompt(source.raw_prompt_ids(prompt), scrub_surrogates(prompt))


def check_token_ids(ids: list[int], vocab_size: int) -> None:
    """A 400 naming ``prompt`` for a token id outside the model's vocabulary. The engine refuses
    it too, but echo decodes the prompt before the engine sees it (a huge id overflowed the
    tokenizer: a 500)."""
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        message = f"prompt: token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
        raise bad_param("prompt", message)


def no_fim(model: str) -> APIError:
    """The 404 for a fill-in-the-middle request to ``model``, whose vocabulary has no FIM tokens:
    what a model needs, and one that has it."""
    markers = ", ".join(family.prefix[0] for family in FIM_FAMILIES)
    return model_cannot(
        model,
        "fill in the middle",
        f"its vocabulary has no FIM tokens (none of {markers}); use a code model trained for "
        f"it, e.g. {FIM_EXAMPLE_MODEL} (localinfer pull {FIM_EXAMPLE_MODEL})",
    )


def sampling_params(
    body: SamplingFields,
    *,
    prompt_tokens: int,
    max_ctx: int,
    logprobs: int | None,
    max_tokens: int | None,
) -> SamplingParams:
    """SamplingParams for the engine. The prompt must leave room for at least one token; a
    ``max_tokens`` beyond the room left is capped at it, and the answer then ends with
    finish_reason "length" (the prompt itself is never truncated)."""
    room = max_ctx - prompt_tokens
    if room < 1:
        # Named with the prompt's own size: "prompt needs 2049 tokens" for a 2048-token prompt
        # read as a miscount.
        what = f"the prompt ({prompt_tokens} tokens) plus one answer token"
        raise ContextOverflowError(requested=prompt_tokens + 1, limit=max_ctx, what=what)
    wanted = room if max_tokens is None else min(max_tokens, room)
    stop = body.stop
    if isinstance(stop, str):
        stop = [stop]
    fields: dict[str, Any] = {
        "max_tokens": wanted,
        "temperature": DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        # OpenAI takes any int64; the sampler's generators want a non-negative seed.
        "seed": None if body.seed is None else body.seed % 2**64,
        "stop": tuple(s for s in (stop or ()) if s),  # OpenAI ignores empty stop strings
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "logprobs": logprobs,
        "ignore_eos": body.ignore_eos,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    for key in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
        if key in fields and not math.isfinite(float(fields[key])):
            raise bad_param(key, f"{key} must be a finite number")
    try:
        return SamplingParams(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = str(err["loc"][0]) if err.get("loc") else None
        raise APIError(
            400, f"{param or 'parameter'}: {err['msg']}", code="invalid_parameter", param=param
        ) from None
