"""From a model and the command line's settings to a built runner: resolve and open the model,
choose the backend, ask the budget (refuse before any weight loads), create the runner.

`open_session` (session.py) runs every model through here; `budget --verify` and `quality` build
bare runners with :func:`open_model` + :func:`build_runner`, so all agree on defaults and on the
budget's verdict. The session's KV tiers are wired here too (:func:`build_kv_tiers`): the
engine's tiers (localinfer/engine/kv/) sized by the budget, the disk tier keyed by the model's
content hash.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.backend_budget import compute_budget
from localinfer.backends.base import Runner, RunnerConfig, kv_transfer
from localinfer.backends.select import BackendChoice, choose_backend, create_runner
from localinfer.budget.compute import BudgetRequest, ensure_fits
from localinfer.budget.file_headers import read_projector
from localinfer.budget.kv_tier import AUTO, kv_ram_bytes, parse_disk_cap, without_kv_ram
from localinfer.budget.memory import cpu_memory
from localinfer.budget.model_facts import facts_of_loaded
from localinfer.budget.report import DEFAULT_CTX, BudgetReport
from localinfer.engine.kv.tiers import DiskTierPlace, KVTiers, open_tiers, tiers_off
from localinfer.errors import InvalidParameterError, ModelFileError, OutOfMemoryBudgetError
from localinfer.facts.gguf_names import find_projector
from localinfer.loading.loader import load_model
from localinfer.loading.model import LoadedModel
from localinfer.loading.rerank_spec import is_reranker
from localinfer.model_hash import model_content_hash
from localinfer.resolve import resolve_model
from localinfer.rpc_nodes import RpcOptions, split_config

if TYPE_CHECKING:
    from localinfer.budget.memory import DeviceMemory
    from localinfer.catalog import CatalogEntry
    from localinfer.kv_options import KVTierOptions

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_SLOTS = 4
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How to run a model, as the command line asks it; None picks the default."""

    backend: str | None = None  # torch | llamacpp | mlx; None: choose_backend's pick
    ctx: int | None = None  # per slot; None: min(DEFAULT_CTX, the model's trained context)
    slots: int = DEFAULT_SLOTS
    dtype: str | None = None  # None: the backend's default on its device (profile)
    quant: str | None = None  # RunnerConfig.quant: None keeps the file's own, "none" floats
    threads: int | None = None  # None: the backend's default (physical cores)
    device: str | None = None  # None: the device the backend choice implies
    force: bool = False  # load without asking the budget whether it fits
    kv_ram: str | None = None  # budget a KV RAM tier: --kv-ram as typed, "auto"; None: none
    kv_dtype: str | None = None  # --kv-dtype: the KV cache's element type; None: the backend's
    memory: DeviceMemory | None = None  # what the budget counts against; None: free memory now
    rpc: RpcOptions | None = None  # --rpc: llama.cpp split across machines (rpc_nodes.py)
    mmproj: str | None = None  # --mmproj: a vision projector (find_projector; None: one beside)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise InvalidParameterError(f"--slots must be at least 1, got {self.slots}")


@dataclass(frozen=True, slots=True)
class OpenedModel:
    """A resolved model with its headers and tokenizer read; the weights stay on disk."""

    model: LoadedModel
    entry: CatalogEntry | None  # its catalog entry (the recommended draft), when named there


@dataclass(slots=True)
class BuiltRunner:
    """A model's runner and the choices it was built with."""

    model: LoadedModel
    runner: Runner
    choice: BackendChoice
    config: RunnerConfig
    budget: BudgetReport | None  # None when forced


def open_model(model_spec: str | None, quant: str | None = None) -> OpenedModel:
    """Resolve ``model_spec`` (default: the embedded model; ``quant`` picks among a catalog
    model's files) and read its headers and tokenizer."""
    resolved = resolve_model(model_spec or DEFAULT_MODEL, quant)
    model = load_model(resolved.require_path(), name=resolved.name)
    return OpenedModel(model, resolved.entry)


def build_runner(model: LoadedModel, settings: RunnerSettings) -> BuiltRunner:
    """Choose the backend once, ask the budget (unless forced), then load the weights.

    ``settings.ctx`` beyond what the model was trained for is an error, never a silent clamp.
    Raises OutOfMemoryBudgetError, with what would fit, before any weight is read.
    """
    ctx = _context(model, settings.ctx)
    # A reranker's scores come from llama.cpp's rank pooling, which only its runner computes.
    backend = settings.backend or ("llamacpp" if is_reranker(model) else None)
    choice = choose_backend(
        backend, model.format, model.file_quant, model.config.arch, settings.kv_dtype
    )
    device = settings.device or choice.device
    config = RunnerConfig(
        slots=settings.slots,
        max_ctx=ctx,
        dtype=settings.dtype or choice.profile.default_dtype(device),
        device=device,
        threads=settings.threads,
        quant=runner_quant(settings.quant, model.file_quant),
        kv_dtype=settings.kv_dtype,
        mmproj=_projector(model, settings.mmproj, choice.name),
    )
    report = None
    if settings.rpc is not None:  # split across machines: the node plan decides (rpc_nodes.py)
        config, choice = split_config(model, config, choice, settings.rpc, settings.force)
    elif not settings.force:
        report = check_budget(model, config, choice.name, settings.kv_ram, settings.memory)
        if report.gpu_layers is not None and report.gpu_layers != report.layers:
            # llama.cpp on a GPU too small for every layer: the ones the budget fitted there.
            config = replace(config, gpu_layers=report.gpu_layers)
            choice = replace(choice, reason=f"{choice.reason}; {report.offload_text}")
    try:
        runner = create_runner(model, config, choice)
    except ModelFileError as exc:
        # A projector found beside the model (not asked for) that does not fit it: a folder of
        # several models. The model runs without images rather than not at all.
        if settings.mmproj is not None or exc.path != config.mmproj:
            raise
        log.warning("%s not loaded, %s runs without images: %s", exc.path, model.name, exc.reason)
        config = replace(config, mmproj=None)
        runner = create_runner(model, config, choice)
    return BuiltRunner(model, runner, choice, config, report)


def runner_quant(asked: str | None, file_quant: str) -> str | None:
    """--quant as the runners take it: the file's own type in any case ("q4_k_m" for a Q4_K_M
    file) spelled as the file names it, since a runner keeps the file's numbers only for that
    exact name (torch's weight plan) and would otherwise try to quantize to it; any other name
    as typed, for the runner to read or refuse."""
    if asked is not None and asked.strip().upper() == file_quant.upper():
        return file_quant
    return asked


def _projector(model: LoadedModel, asked: str | None, backend: str) -> str | None:
    """The vision projector to load (``--mmproj``, or one found beside a GGUF); only llama.cpp
    reads one, so for another backend an asked one is refused and a found one left."""
    off = asked is None or asked.lower() == "none"
    if model.format != "gguf":
        if not off:
            raise InvalidParameterError("--mmproj: a vision projector goes with a GGUF model")
        return None
    found = find_projector(Path(model.path), asked)
    if found is None or backend == "llamacpp":
        return None if found is None else str(found)
    if not off:
        raise InvalidParameterError(
            f"--mmproj: images run on the llama.cpp runner, not {backend}; add --backend llamacpp"
        )
    return None


def check_budget(
    model: LoadedModel,
    config: RunnerConfig,
    backend: str,
    kv_ram: str | None = None,
    memory: DeviceMemory | None = None,
) -> BudgetReport:
    """The budget of running ``model`` as ``config`` on ``backend`` (file headers only), with a
    KV RAM tier when ``kv_ram`` asks for one; raises OutOfMemoryBudgetError with the budget's own
    explanation when it does not fit."""
    request = BudgetRequest(  # model, ctx, concurrency, quant: as the runner is configured
        str(model.path),
        config.max_ctx,
        config.slots,
        config.quant,
        device=config.device,
        backend=backend,
        dtype=config.dtype,
        kv_dtype=config.kv_dtype,
        kv_ram=kv_ram,
    )
    facts = facts_of_loaded(model)
    if config.mmproj is not None:  # counted with the weights, as `budget --mmproj` counts it
        path = Path(config.mmproj)
        facts = replace(facts, projector=read_projector(path, path.name))
    report = compute_budget(request, memory=memory, facts=facts)
    try:
        return ensure_fits(report)
    except OutOfMemoryBudgetError as exc:
        raise OutOfMemoryBudgetError(f"{exc}; --force loads it anyway") from None


def _context(model: LoadedModel, asked: int | None) -> int:
    trained = model.config.max_ctx
    ctx = min(DEFAULT_CTX, trained) if asked is None else asked
    if ctx < 2:
        raise InvalidParameterError(f"--ctx must be at least 2, got {ctx}")
    if ctx > trained:
        raise InvalidParameterError(
            f"--ctx {ctx} is more than {model.name} was trained for ({trained} tokens)"
        )
    return ctx


# -- The KV tiers (issue #24): the engine's, sized by the budget --------------------------------


def budgeted_kv_ram(kv: KVTierOptions | None, prefix_reuse: bool = True) -> str | None:
    """What the budget is asked about the RAM tier (``BudgetRequest.kv_ram``: None for no tiers,
    "auto" for the default share; None without ``prefix_reuse``, which the tiers need); refuses
    bad disk flags before any weight loads (the RAM size is checked by the budget, against the
    memory it sees)."""
    if kv is None:
        return None
    parse_disk_cap(kv.disk_cap)
    if kv.disk is not None and kv.disk.exists() and not kv.disk.is_dir():
        raise InvalidParameterError(f"--kv-disk {kv.disk} is a file, not a directory")
    return (kv.ram or AUTO) if prefix_reuse else None


def build_kv_tiers(kv: KVTierOptions | None, built: BuiltRunner, *, prefix_reuse: bool) -> KVTiers:
    """The tiers ``kv`` asks for on ``built``'s runner (None: no tiers). Tiers need a runner whose
    KV cache moves its cells (``KVTransfer``) and prefix reuse; without them they are off with
    one notice, and ``built.budget`` loses the RAM tier's row."""
    tiers = KVTiers() if kv is None else _kv_tiers(kv, built, prefix_reuse)
    if tiers.ram is None and built.budget is not None:
        built.budget = without_kv_ram(built.budget)
    return tiers


def _kv_tiers(kv: KVTierOptions, built: BuiltRunner, prefix_reuse: bool) -> KVTiers:
    off = tiers_off(built.runner, prefix_reuse)
    cache = kv_transfer(built.runner)
    if off is not None or cache is None:
        return off or KVTiers()
    if built.budget is not None:
        ram_cap = built.budget.kv_ram_bytes
    else:  # --force: no budget; the weights are loaded, so free RAM is what is left after them
        ram_cap = kv_ram_bytes(kv.ram, cpu_memory()[0])
    disk = None
    if kv.disk is not None:
        try:
            kv.disk.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidParameterError(f"--kv-disk {kv.disk}: {exc.strerror or exc}") from None
        content_hash = model_content_hash(built.model.path)
        disk = DiskTierPlace(kv.disk, content_hash, parse_disk_cap(kv.disk_cap))
    return open_tiers(cache, ram_cap, disk)
