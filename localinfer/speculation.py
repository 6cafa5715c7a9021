"""Speculative decoding as the session sets it up: what ``--draft`` asks for (off, ``ngram``,
``auto``: the catalog's recommended draft for the target, or a draft model spec), whether a draft
model can draft for the target, and the speculation settings that suit the target's backend.

The session builds the draft model's runner (session.build_runner) and hands the engine a
finished Speculator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer.backends.select import backend_profile
from localinfer.engine.speculative import SpecConfig, check_shared_tokenizer
from localinfer.errors import InvalidParameterError

if TYPE_CHECKING:
    from localinfer.catalog import CatalogEntry
    from localinfer.loading.model import LoadedModel

NGRAM = "ngram"
_OFF = ("", "off", "none")

# A draft-model step's cost relative to a target decode step, the starting guess until the
# Speculator measures it; scripts/bench-speculative measures it for a given pair.
DRAFT_STEP_COST = 0.3


def draft_source(
    draft: str | None, target_name: str, target_entry: CatalogEntry | None
) -> str | None:
    """What ``--draft`` asks for: None (off), NGRAM, or the spec of the draft model to load."""
    choice = (draft or "off").strip()
    if choice.lower() in _OFF:
        return None
    if choice.lower() == NGRAM:
        return NGRAM
    if choice.lower() != "auto":
        return choice
    if target_entry is None or target_entry.draft is None:
        raise InvalidParameterError(
            f"{target_name} has no recommended draft model in the catalog; "
            "use --draft ngram or name a draft model"
        )
    return target_entry.draft


def default_spec_config(
    backend: str, device: str, *, with_draft: bool = False, weights: str | None = None
) -> SpecConfig:
    """Speculation settings for a target on ``backend``/``device`` holding ``weights``
    (RunnerInfo.quant): the verification costs its backend profile measured."""
    costs = backend_profile(backend).speculation(device, weights)
    return SpecConfig(
        verify_cost=costs.per_token,
        verify_fixed=costs.fixed,
        draft_cost=DRAFT_STEP_COST if with_draft else 0.0,
        max_busy_slots=costs.max_busy_slots,
    )


def check_draft_model(target: LoadedModel, draft: LoadedModel, ctx: int) -> None:
    """Raise InvalidParameterError unless ``draft`` shares the target's tokenizer and was
    trained for the ``ctx`` tokens per slot the target runs with."""
    check_shared_tokenizer(target.tokenizer, draft.tokenizer, names=(target.name, draft.name))
    if draft.config.max_ctx < ctx:
        raise InvalidParameterError(
            f"draft model {draft.name} was trained for {draft.config.max_ctx} tokens, less than "
            f"the context asked for ({ctx})"
        )
