"""The chat's model picker: every listed model (localinfer.model_listing, as `localinfer models`)
with its budget at the chat's context, slots and backend, so the picker and the CLI agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.tui.settings import ChatSettings

if TYPE_CHECKING:
    from localinfer.model_listing import ListedModel


@dataclass(slots=True, frozen=True)
class ModelChoice:
    name: str  # what open_session accepts
    source: str  # "bundled" | "catalog" | "hub" | "local"
    size_bytes: int | None  # predicted total at the chosen context, when known
    fits: bool | None  # None: the budget could not tell
    note: str = ""
    current: bool = False


def list_model_choices(ctx: int, settings: ChatSettings, current: str | None) -> list[ModelChoice]:
    """Catalog models, model repos in the local Hugging Face cache that the catalog does not
    name, and ``current`` (the loaded model's spec) when it is neither; on this machine first,
    then by size."""
    from localinfer.errors import LocalinferError
    from localinfer.model_listing import BudgetAsk, ListedModel, budget_for, list_models

    ask = BudgetAsk(ctx=ctx, concurrency=settings.slots, backend=settings.backend)
    listed = list_models(ask)
    if current is not None and current not in {m.name for m in listed}:
        try:
            extra = ListedModel(current, "local", None, None, "", budget_for(current, ask))
        except LocalinferError as exc:
            extra = ListedModel(current, "local", None, None, "", error=str(exc))
        listed.insert(0, extra)
    choices = [_choice(model, ctx, model.name == current) for model in listed]
    choices.sort(key=lambda c: (not c.current, c.note != "", c.size_bytes or 0))
    return choices


def _choice(model: ListedModel, ctx: int, current: bool) -> ModelChoice:
    report = model.report
    on_disk = report.model_path is not None if report is not None else model.on_disk
    if model.source in ("embedded", "bundled"):
        source = "bundled"
    elif on_disk or model.source == "local":  # a path or repo id outside the listing too
        source = "local"
    else:  # not on disk: a catalog entry, or a Hub repo whose metadata a budget read
        source = "hub" if model.source == "hub" else "catalog"
    if report is None:
        return ModelChoice(model.name, source, None, None, model.error[:60], current)
    note = "" if on_disk else "not on disk: localinfer pull"
    if report.ctx < ctx:
        note = f"trained for {report.model_max_ctx} tokens" + (f"; {note}" if note else "")
    return ModelChoice(model.name, source, report.total_bytes, report.fits, note, current)
