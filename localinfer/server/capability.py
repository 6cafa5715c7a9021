"""A model that cannot do what a route asks of it answers 404, naming the model and what it lacks.

OpenAI answers 404 when a model does not serve an endpoint ("This is a chat model and not
supported in the v1/completions endpoint"): the request is well formed, and the same body to
another model would be answered. So here, on every API's routes alike (the body is OpenAI's or
Anthropic's by path, ``errors``):

* a chat (chat completions, Anthropic's Messages and count_tokens, the Responses API) asked of a
  base model, or of one with no chat template and no turn tokens;
* fill-in-the-middle (``suffix``, /v1/fim/completions) asked of a model without FIM tokens;
* embeddings asked of a runner that computes none, or of a model whose pooling localinfer does
  not compute, or longer than the model's vectors are.

A parameter that is wrong whatever the model (a negative ``max_tokens``) stays a 400. Loading a
model that localinfer cannot run at all is the load's error, not one of these.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from localinfer.errors import UnsupportedModelError
from localinfer.server.errors import APIError

STATUS = 404
CODE = UnsupportedModelError.code


def model_cannot(model: str, what: str, why: str, *, param: str = "model") -> APIError:
    """The 404 for ``model``, which cannot ``what`` (``why``: what it lacks, what to use)."""
    return APIError(STATUS, f"model '{model}' cannot {what}: {why}", code=CODE, param=param)


@contextmanager
def capability_refused(model: str, what: str, *, param: str = "model") -> Iterator[None]:
    """The UnsupportedModelError a session or engine raises for a request (it names what the
    model lacks) as ``model_cannot``."""
    try:
        yield
    except UnsupportedModelError as exc:
        raise model_cannot(model, what, str(exc), param=param) from None
