"""Budget figures for the chat: which models fit at the chosen context, and the loaded one's plan.

Both call the same ``compute_budget`` as `localinfer budget`, so the picker and the CLI agree.
"""

from __future__ import annotations

from typing import Any

from localinfer.errors import LocalinferError
from localinfer.tui.host import MemoryParts, ModelChoice
from localinfer.tui.settings import ChatSettings


def list_model_choices(ctx: int, settings: ChatSettings, current: str | None) -> list[ModelChoice]:
    """Catalog models, model repos in the local Hugging Face cache that the catalog does not
    name, and ``current`` (the loaded model's spec) when it is neither."""
    from localinfer.catalog import load_catalog
    from localinfer.resolve import catalog_entry_for_repo, list_cached_repos

    catalog = load_catalog()
    choices = []
    for name in catalog.names():
        entry = catalog.get(name)
        assert entry is not None
        choices.append(_choice(name, entry.source.kind, ctx, settings, current))
    named = set(catalog.names())
    for repo in list_cached_repos():
        if catalog_entry_for_repo(repo.repo_id) is None:
            choices.append(_choice(repo.repo_id, "local", ctx, settings, current))
            named.add(repo.repo_id)
    if current is not None and current not in named:
        choices.insert(0, _choice(current, "local", ctx, settings, current))
    # Models on this machine first, then by size.
    choices.sort(key=lambda c: (not c.current, c.note != "", c.size_bytes or 0))
    return choices


def _choice(
    name: str, kind: str, ctx: int, settings: ChatSettings, current: str | None
) -> ModelChoice:
    from localinfer.budget import BudgetRequest, compute_budget

    is_current = name == current
    try:
        report = compute_budget(
            BudgetRequest(model=name, ctx=ctx, concurrency=settings.slots, backend=settings.backend)
        )
    except LocalinferError as exc:
        return ModelChoice(name, kind, None, None, note=str(exc)[:60], current=is_current)
    source = "bundled" if kind == "bundled" else "local" if report.model_path else "catalog"
    note = "" if report.model_path else "not on disk: localinfer pull"
    if report.ctx < ctx:
        note = f"trained for {report.model_max_ctx} tokens" + (f"; {note}" if note else "")
    return ModelChoice(name, source, report.total_bytes, report.fits, note=note, current=is_current)


def predict_loaded(session: Any, settings: ChatSettings) -> tuple[MemoryParts | None, int | None]:
    """The budget's prediction for the loaded model at its actual slots x context and backend."""
    from localinfer.budget import BudgetRequest, compute_budget

    info = session.engine.runner.info
    try:
        report = compute_budget(
            BudgetRequest(
                model=str(session.model.path),
                ctx=info.max_ctx,
                concurrency=info.slots,
                backend=info.backend,
            )
        )
    except LocalinferError:
        return None, None
    parts = MemoryParts(report.weights_bytes, report.kv_cache_bytes, report.overhead_bytes)
    return parts, report.available_bytes
