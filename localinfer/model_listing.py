"""The models there are to run: the catalog's, model repos in the Hugging Face cache that the
catalog does not name, and Hub models budgeted before (their metadata cached, the weights not
downloaded yet), each with its budget on one device. `localinfer models` prints them; the chat's
model picker offers them. Listing never asks the Hub."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.backend_budget import compute_budget
from localinfer.backend_profile import stored_measurements_only
from localinfer.budget.compute import BudgetRequest
from localinfer.budget.memory import device_memory
from localinfer.catalog import BundledSource, load_catalog
from localinfer.errors import LocalinferError
from localinfer.resolve import list_cached_repos, resolve_model

if TYPE_CHECKING:
    from localinfer.budget.memory import DeviceMemory
    from localinfer.budget.report import BudgetReport

EMBEDDED = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class BudgetAsk:
    """What every listed model is budgeted for; None: the budget's default."""

    ctx: int | None = None
    concurrency: int = 1
    backend: str | None = None


@dataclass(frozen=True, slots=True)
class ListedModel:
    name: str  # what open_session accepts
    source: str  # embedded | bundled | hf cache | catalog | hub (budgeted, not downloaded)
    path: Path | None  # None: not on this machine yet
    size_on_disk: int | None
    description: str
    report: BudgetReport | None = None  # None: the budget could not tell (``error`` says why)
    error: str = ""

    @property
    def on_disk(self) -> bool:
        return self.path is not None


def list_models(ask: BudgetAsk, memory: DeviceMemory | None = None) -> list[ListedModel]:
    """Catalog models in catalog order, then cached repos by id; ``memory``: the device to
    budget for (default: this machine's, read once).

    The budgets use only what this machine has measured already: a head shape whose llama.cpp
    attention was never timed here counts llama.cpp's default, flash attention on, as the
    listing's row (``budget MODEL`` and the runner measure it)."""
    with stored_measurements_only():
        return _list_models(ask, memory or device_memory("auto"))


def _list_models(ask: BudgetAsk, memory: DeviceMemory) -> list[ListedModel]:
    listed: list[ListedModel] = []
    seen_paths: set[Path] = set()
    for entry in load_catalog().entries.values():
        path = resolve_model(entry.name, assemble=False).path
        if path is not None:
            seen_paths.add(path)
        if isinstance(entry.source, BundledSource):
            source = "embedded" if entry.name == EMBEDDED else "bundled"
        else:
            source = "hf cache" if path is not None else "catalog"
        size = _size_on_disk(path) if path is not None else None
        model = ListedModel(entry.name, source, path, size, entry.description)
        listed.append(_with_budget(model, ask, memory))
    for repo in list_cached_repos():
        try:
            resolved = resolve_model(repo.repo_id)
        except LocalinferError:
            continue  # a cached repo that holds no model weights (a tokenizer, a dataset card)
        if resolved.path in seen_paths or resolved.entry is not None:
            continue  # already listed as a catalog model
        model = ListedModel(
            repo.repo_id, "hf cache", resolved.path, repo.size_on_disk, "cached Hugging Face repo"
        )
        listed.append(_with_budget(model, ask, memory))
    listed += _hub_models(ask, memory)
    return listed


def _hub_models(ask: BudgetAsk, memory: DeviceMemory) -> list[ListedModel]:
    """Hub models whose metadata a budget read, not on disk: budgeted from that metadata."""
    from localinfer.budget.hub_metadata import cached_hub_models
    from localinfer.budget.remote_facts import hub_facts

    listed = []
    for spec in cached_hub_models():
        try:
            resolved = resolve_model(spec, assemble=False)
        except LocalinferError:
            continue
        if resolved.kind != "hub_remote":
            continue  # on disk now (listed above), or a catalog model
        model = ListedModel(spec, "hub", None, None, "on the Hub: localinfer pull to run")
        try:
            facts = hub_facts(resolved, None, cached_only=True)
            request = BudgetRequest(
                spec, ctx=ask.ctx, concurrency=ask.concurrency, backend=ask.backend
            )
            report = compute_budget(request, memory, facts)
        except LocalinferError as exc:
            listed.append(dataclasses.replace(model, error=str(exc)))
            continue
        listed.append(dataclasses.replace(model, report=report))
    return listed


def budget_for(spec: str, ask: BudgetAsk, memory: DeviceMemory | None = None) -> BudgetReport:
    """The budget of one model as every listed model gets it."""
    request = BudgetRequest(spec, ctx=ask.ctx, concurrency=ask.concurrency, backend=ask.backend)
    return compute_budget(request, memory)


def _with_budget(model: ListedModel, ask: BudgetAsk, memory: DeviceMemory) -> ListedModel:
    """A broken file or a model the budget cannot read shows its error instead of failing the
    whole listing."""
    try:
        return dataclasses.replace(model, report=budget_for(model.name, ask, memory))
    except LocalinferError as exc:
        return dataclasses.replace(model, error=str(exc))


def _size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
