"""Which models `localinfer serve` may load, what each costs, and how it opens them: the
``ModelSupply`` of its pool.

    --models-from catalog   (default) catalog models on this machine (the embedded one, those
                            pulled) and cached Hugging Face repos: what `localinfer models`
                            lists as on disk
    --models-from local     those, and any model file or folder a request names by path
    --models-from none      only the models named on the command line

Nothing is downloaded: a name that is not on disk is a 404. Each model's cost is the budget's
total (`localinfer budget MODEL --ctx C --concurrency SLOTS`, on the device its backend runs on),
counted against that device's free memory read once, or against ``--device SIZE``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.backend_budget import compute_budget, device_backend
from localinfer.budget.compute import BudgetRequest
from localinfer.budget.memory import DeviceMemory, device_memory, human_bytes
from localinfer.budget.model_facts import model_facts
from localinfer.catalog import ALIASES, load_catalog
from localinfer.errors import InvalidParameterError, LocalinferError
from localinfer.resolve import (
    ResolvedModel,
    existing_path,
    list_cached_repos,
    looks_like_repo_id,
    resolve_model,
)
from localinfer.runner_setup import budgeted_kv_ram
from localinfer.server.memory_plan import BudgetNeed
from localinfer.server.pool_model import ModelSource

if TYPE_CHECKING:
    from localinfer.server.served_session import ServedSession

log = logging.getLogger(__name__)

MODELS_FROM = ("catalog", "local", "none")


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """How `serve` runs every model it loads (its flags), and which models it may load."""

    slots: int = 4
    ctx: int | None = None  # None: 2048, or the model's trained context if less
    backend: str | None = None
    quant: str | None = None
    dtype: str | None = None
    force: bool = False  # load without the budget: models are then not counted either
    memory: int | None = None  # --device SIZE: what the models share; None: the device's free
    models_from: str = "catalog"
    # open_session's other keywords, passed as they are: threads, max_queue, kv, draft, ...
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.models_from not in MODELS_FROM:
            raise InvalidParameterError(
                f"--models-from must be one of {', '.join(MODELS_FROM)}, got '{self.models_from}'"
            )

    def session_options(self) -> dict[str, Any]:
        """open_session's keywords."""
        fields = ("slots", "ctx", "backend", "quant", "dtype", "force")
        return {**self.options, **{name: getattr(self, name) for name in fields}}


class ServeSupply:
    """Finds models on this machine, budgets them and opens them as sessions."""

    def __init__(self, settings: LoadSettings, named: Sequence[str] = ()) -> None:
        self.settings = settings
        self._named = set(named)  # the names given on the command line (and --pin)
        self._memory: dict[str, DeviceMemory] = {}  # per device, read once
        self._devices: dict[str, str] = {}  # model key -> the device its budget was asked on

    def find(self, name: str) -> ModelSource | None:
        allowed = self.settings.models_from
        if name not in self._named:
            if allowed == "none":
                return None
            # Paths only with --models-from local: a name that is neither a catalog name nor a
            # repo id never reaches path code (an unknown ~user, a name too long for a file).
            if allowed == "catalog" and (not _catalog_or_repo(name) or _is_path(name)):
                return None
        try:
            resolved = resolve_model(name, self.settings.quant, assemble=False)
        except LocalinferError:
            return None
        except OSError as exc:  # a path the user allowed, unreadable: not a model served here
            log.info("model %r not served: %s", name, exc)
            return None
        if not resolved.on_disk:
            return None  # not downloaded: never fetched on a request
        return _source(resolved, name)

    def listed(self) -> list[ModelSource]:
        if self.settings.models_from == "none":
            return []
        found: dict[str, ModelSource] = {}
        names = list(load_catalog().entries) + [repo.repo_id for repo in list_cached_repos()]
        for name in names:
            try:
                resolved = resolve_model(name, self.settings.quant, assemble=False)
            except LocalinferError:
                continue  # a cached repo without weights, a quant this model lacks
            if resolved.on_disk:
                source = _source(resolved, name)
                found.setdefault(source.key, source)
        return list(found.values())

    def need(self, source: ModelSource) -> BudgetNeed | None:
        """The budget of ``source`` as the session will ask it: same backend, device, dtype,
        quantization, slots and context."""
        if self.settings.force or self.settings.options.get("rpc") is not None:
            return None  # --rpc: split across machines, the session's node plan decides
        s = self.settings
        resolved = resolve_model(source.spec, s.quant)
        facts = model_facts(resolved)
        kv_dtype = s.options.get("kv_dtype")
        backend = device_backend(s.backend, facts, kv_dtype)
        quant = s.quant if s.quant and s.quant.lower() != "none" else None
        request = BudgetRequest(
            str(resolved.require_path()),
            s.ctx,
            s.slots,
            quant,
            device=backend.device,
            backend=backend.name,
            dtype=s.dtype or backend.dtype,
            kv_dtype=kv_dtype,
            kv_ram=budgeted_kv_ram(s.options.get("kv")),  # the session's own budget rows
        )
        memory = self.memory_for(backend.device)
        self._devices[source.key] = backend.device
        report = compute_budget(request, memory, facts)
        summary = f"{source.id or report.model} at {report.ctx} ctx x {report.concurrency} slots"
        return BudgetNeed(memory.device, report.total_bytes, memory.available, summary)

    def memory_for(self, device: str) -> DeviceMemory:
        """The memory models on ``device`` share: --device SIZE, else its free memory the first
        time it is asked (before anything loads on it)."""
        if device not in self._memory:
            size = self.settings.memory
            if size is not None:
                kind = "cuda" if device.startswith("cuda") else device
                label = f"--device {human_bytes(size)}"
                self._memory[device] = DeviceMemory(label, kind, size, size, "the --device limit")
            else:
                self._memory[device] = device_memory(device)
        return self._memory[device]

    def open(self, source: ModelSource) -> ServedSession:
        from localinfer.session import open_session

        # The session's budget counts against the memory this pool shares out (its plan made room
        # for the model beside the others), not against what is free once they have loaded.
        device = self._devices.get(source.key)
        memory = self.memory_for(device) if device is not None else None
        return open_session(source.spec, budget_memory=memory, **self.settings.session_options())


def named_source(supply: ServeSupply, name: str, served_name: str | None = None) -> ModelSource:
    """The source of a model named on the command line (``served_name`` renames it); a one-line
    error when it is not on this machine."""
    source = supply.find(name)
    if source is None:
        resolve_model(name, supply.settings.quant).require_path()  # says why
        raise InvalidParameterError(f"cannot serve '{name}'")
    if served_name:
        aliases = source.aliases | {source.id} if source.id else source.aliases
        source = dataclasses.replace(source, id=served_name, aliases=aliases)
    return source


def _source(resolved: ResolvedModel, name: str) -> ModelSource:
    assert resolved.path is not None
    key = str(resolved.path.resolve())  # the file decides: every model runs with serve's flags
    aliases = {name, *(alias for alias, target in ALIASES.items() if target == resolved.name)}
    return ModelSource(key, resolved.name, name, frozenset(aliases - {resolved.name}))


def _is_path(name: str) -> bool:
    return existing_path(name) is not None


def _catalog_or_repo(name: str) -> bool:
    """Whether ``name`` (with or without its ``:QUANT``) reads as a catalog name or a Hugging Face
    repo id; decided from the text alone."""
    base = name.rpartition(":")[0] or name
    catalog = load_catalog()
    return any(catalog.get(n) is not None or looks_like_repo_id(n) for n in (name, base))
