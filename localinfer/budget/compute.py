"""The budget: weights + KV cache + overhead against the memory of a device.

`compute_budget(BudgetRequest, plan_backend) -> BudgetReport` is the one entry point. The budget
imports no backend: ``plan_backend`` answers which backend runs the model on the device and hands
over its profile (localinfer/backend_budget.py passes backends/select.py's rule, and is what the
CLI, the session before it loads anything and the TUI call). The arithmetic lives in planner.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from localinfer.budget.kv_tier import KVRamTier, kv_ram_tier
from localinfer.budget.memory import DeviceMemory, cpu_memory, device_memory, human_bytes
from localinfer.budget.model_facts import ModelFacts, model_facts
from localinfer.budget.offload import OffloadPlan, layer_bytes, plan_offload
from localinfer.budget.planner import Breakdown, Planner, kv_cache_bytes
from localinfer.budget.report import (
    DEFAULT_CTX,
    BudgetReport,
    BudgetRequest,
    Suggestion,
    VisionReport,
    VllmPlan,
)
from localinfer.budget.vision import tokens_text
from localinfer.errors import (
    InvalidParameterError,
    OutOfMemoryBudgetError,
    UnsupportedModelError,
)
from localinfer.facts.kv_dtype import KVDtype, kv_dtype
from localinfer.facts.quant import normalize_quant
from localinfer.resolve import resolve_model, split_quant_tag

if TYPE_CHECKING:
    from localinfer.backend_profile import BackendProfile

__all__ = [
    "DEFAULT_CTX",
    "BudgetReport",
    "BudgetRequest",
    "PlanBackend",
    "Planner",
    "Suggestion",
    "VllmPlan",
    "compute_budget",
    "ensure_fits",
    "kv_cache_bytes",
]


class PlanBackend(Protocol):
    """The profile of the backend the budget costs on a device of ``device_kind`` (cpu | cuda |
    metal | planned: a named machine), installed here or not: ``requested`` (--backend) when
    given, else the selection rule, which the file's format, dominant type and architecture and
    the KV cache type asked take part in."""

    def __call__(
        self,
        device_kind: str,
        requested: str | None,
        model_format: str | None = None,
        file_quant: str | None = None,
        arch: str | None = None,
        kv_dtype: str | None = None,
    ) -> BackendProfile: ...


def _planned_profile(
    plan_backend: PlanBackend,
    memory: DeviceMemory,
    asked: str | None,
    facts: ModelFacts | None = None,
    kv_dtype: str | None = None,
) -> BackendProfile:
    """The backend for the device the budget is for; ``facts`` (given when the file's own
    quantization is asked) let this CPU pick the native kernels for the file's blocks, unless
    ``kv_dtype`` is a cache type only llama.cpp holds."""
    # A CPU machine that is not this one: its CPU was never measured, so llama.cpp's rule.
    kind = "planned" if memory.planned and memory.kind == "cpu" else memory.kind
    if facts is None:
        return plan_backend(kind, asked, kv_dtype=kv_dtype)
    model_format = facts.format or "gguf"  # a catalog entry's default is a GGUF file
    quant, arch = facts.native_quant, facts.arch.arch
    return plan_backend(kind, asked, model_format, quant, arch, kv_dtype)


# llama.cpp runs GGUF types: its int8/int4 are the files `localinfer quantize` writes.
_LLAMACPP_FRIENDLY = {"int8": "Q8_0", "int4": "Q4_K_M"}


def resolve_quant(facts: ModelFacts, asked: str | None, backend: str | None = None) -> str:
    if asked is None or _picked_the_file(facts, asked):
        return facts.native_quant
    if asked.strip().lower() == "none":  # unquantized: the safetensors dtype, else 16-bit
        return facts.native_quant if facts.format == "safetensors" else "bf16"
    quant = normalize_quant(asked)
    if backend == "llamacpp" and facts.format != "safetensors":  # GGUF models only
        return _LLAMACPP_FRIENDLY.get(quant, quant)
    return quant


def _picked_the_file(facts: ModelFacts, asked: str) -> bool:
    """Whether ``asked`` is the tag that chose the GGUF file among a repo's or folder's files
    ('UD-Q4_K_XL' too): the file is then budgeted as it is."""
    picked = facts.resolved.picked_by
    return facts.format == "gguf" and picked is not None and picked.lower() == asked.lower()


def _request_quant(request: BudgetRequest) -> str | None:
    """The quantization a request asks for, whether by --quant or by MODEL:QUANT."""
    return split_quant_tag(request.model.strip(), request.quant)[1]


def compute_budget(
    request: BudgetRequest,
    plan_backend: PlanBackend,
    memory: DeviceMemory | None = None,
    facts: ModelFacts | None = None,
) -> BudgetReport:
    """Memory needed by `request.model` at the asked settings, and what fits when it doesn't.

    `plan_backend` picks the backend and hands over its profile; `memory` skips reading the
    device again when many models are checked against one machine; `facts` (the session's open
    model: model_facts.facts_of_loaded) skips resolving and reading the model again.
    """
    from localinfer.budget.plan import suggestions_for, vllm_plan_for

    asked_quant = _request_quant(request)
    if facts is None:
        resolved = resolve_model(request.model, request.quant, assemble=False)
        facts = model_facts(resolved, online=request.online, mmproj=request.mmproj)
    resolved, arch = facts.resolved, facts.arch
    ctx = request.ctx if request.ctx is not None else min(DEFAULT_CTX, arch.max_ctx)
    if ctx > arch.max_ctx:
        raise InvalidParameterError(
            f"--ctx {ctx} is beyond {facts.name}'s maximum context of {arch.max_ctx} tokens"
        )
    memory = memory or device_memory(request.device)
    own_file = asked_quant is None or _picked_the_file(facts, asked_quant)
    # A reranker runs on llama.cpp (runner_setup.py): its rank pooling is llama.cpp's.
    asked_backend = request.backend or ("llamacpp" if arch.reranker else None)
    profile = _planned_profile(
        plan_backend, memory, asked_backend, facts if own_file else None, request.kv_dtype
    )
    backend = profile.name
    quant = resolve_quant(facts, asked_quant, backend)
    _check_sequences(profile.name, profile.max_sequences, request.concurrency)
    if not own_file and asked_quant is not None:
        _check_quant(profile, asked_quant.strip(), facts.native_quant)
    chunk = request.prefill_chunk or profile.memory.prefill_chunk
    planner = Planner(facts, profile, chunk, memory.kind, request.dtype)
    kv = _kv_type(planner, profile, request.kv_dtype)
    parts = planner.breakdown(quant, ctx, request.concurrency, kv)
    ram = _kv_ram(request, memory, parts.total)
    # What the planner may fill: the device's memory, less a RAM tier drawn from the same memory.
    budget = memory.available - (ram.bytes if ram.counted else 0)
    offload = _gpu_offload(facts, parts, memory, budget) if backend == "llamacpp" else None
    fits = parts.total <= budget if offload is None else _offload_fits(offload, memory)
    report = BudgetReport(
        model=facts.name,
        model_path=str(resolved.path) if resolved.on_disk else None,
        model_kind=resolved.kind,
        arch=arch.arch,
        params=facts.params,
        quant=quant,
        kv_dtype=kv.name,
        ctx=ctx,
        concurrency=request.concurrency,
        prefill_chunk=chunk,
        device=memory.device,
        backend=backend,
        **{**parts.report_fields(), "total_bytes": parts.total + (ram.bytes if ram.counted else 0)},
        kv_ram_bytes=ram.bytes,
        kv_ram_counted=ram.counted,
        available_bytes=memory.available,
        device_total_bytes=memory.total,
        fits=fits,
        max_context=planner.max_context(budget, quant, request.concurrency, kv),
        max_concurrency=planner.max_sequences(budget, quant, ctx, kv),
        model_max_ctx=arch.max_ctx,
        **_planner_fields(planner, quant),
        download_bytes=facts.download_bytes,
        reranker=arch.reranker,
        encoder=arch.encoder,
    )
    if offload is not None:
        report.gpu_layers, report.layers, report.host_bytes = (
            offload.gpu_layers, offload.layers, offload.host_bytes)  # fmt: skip
    if not fits or (offload is not None and not offload.full):  # partial: what fits wholly
        report.suggestions = suggestions_for(planner, budget, quant, ctx, request.concurrency, kv)
        if not report.suggestions and not fits:
            report.vllm = vllm_plan_for(facts, ctx, request.concurrency, kv)
    return report


def _planner_fields(planner: Planner, quant: str) -> dict[str, Any]:
    """The report's fields the planner answers beside the breakdown: the form each stored
    matrix type is held in, the projector counted, those beside the model, its figures."""
    facts = planner.facts
    return {
        "weight_forms": planner.weight_forms(quant),
        "mmproj": facts.projector.name if facts.projector else None,
        "mmproj_files": list(facts.projectors),
        "vision": _vision_report(planner),
    }


def _vision_report(planner: Planner) -> VisionReport | None:
    """The counted projector's figures (budget/vision.py), or None without one."""
    projector, cost = planner.facts.projector, planner.vision_cost()
    if projector is None or projector.vision is None or cost is None:
        return None
    shape = projector.vision
    return VisionReport(
        projector_bytes=projector.weight_bytes,
        compute_bytes=cost.total,
        graph_bytes=cost.graph,
        work_bytes=cost.work,
        context_bytes=cost.context,
        image_bytes=cost.image,
        projector_type=shape.projector_type,
        image_size=shape.image_size,
        patches=shape.patches,
        image_tokens=shape.image_tokens,
        tokens_text=tokens_text(shape),
        modelled=shape.modelled,
    )


def _kv_type(planner: Planner, profile: BackendProfile, asked: str | None) -> KVDtype:
    """The KV cache type: the one asked, else the backend's; refused now where the runner
    would refuse it (select.py)."""
    refusal = profile.kv_dtype_refusal(asked, planner.compute_dtype())
    if refusal is not None:
        raise UnsupportedModelError(refusal)
    return kv_dtype(planner.default_kv_dtype() if asked is None else asked)


def _offload_fits(offload: OffloadPlan, memory: DeviceMemory) -> bool:
    """Some layers on the GPU, and (on this machine) the rest in the RAM left."""
    return offload.gpu_layers > 0 and (memory.planned or offload.host_bytes <= cpu_memory()[0])


def _gpu_offload(
    facts: ModelFacts, parts: Breakdown, memory: DeviceMemory, budget: int
) -> OffloadPlan | None:
    """llama.cpp on a GPU: the layers that fit there (offload.py); None off the GPU."""
    if memory.kind not in ("cuda", "metal"):
        return None
    projector = facts.projector.weight_bytes if facts.projector is not None else 0
    return plan_offload(parts, layer_bytes(facts, parts.weights - projector), budget)


def _check_quant(profile: BackendProfile, asked: str, file_quant: str | None) -> None:
    """Refuse now a quantization the backend's runner would refuse at load time."""
    refusal = profile.quant_refusal(asked, file_quant)
    if refusal is not None:
        raise UnsupportedModelError(refusal)


def _check_sequences(backend: str, limit: int | None, asked: int) -> None:
    """Refuse more sequences than the backend's runner can create (it would fail at load time
    whatever the memory: llama.cpp's context refuses n_seq_max above LLAMA_MAX_SEQ)."""
    if limit is not None and asked > limit:
        raise InvalidParameterError(
            f"the {backend} backend runs at most {limit} sequences at once, not {asked}; "
            f"ask for {limit} or fewer (--concurrency, or --slots when loading) or another backend"
        )


def _kv_ram(request: BudgetRequest, memory: DeviceMemory, model_total: int) -> KVRamTier:
    if request.kv_ram is None:
        return KVRamTier(0, False)
    return kv_ram_tier(request.kv_ram, memory.kind, memory.available, model_total)


def ensure_fits(report: BudgetReport) -> BudgetReport:
    """The report if it fits; else OutOfMemoryBudgetError saying what would fit, in the loading
    commands' flags (for the engine, which refuses to load what won't fit)."""
    if report.fits:
        return report
    changes = [_as_session_flags(s.change) for s in report.suggestions]
    hints = [f"try {change}" for change in changes if change is not None][:3]
    if not hints and report.vllm is not None:
        hints.append(f"needs {report.vllm.gpus} x 80 GiB GPUs: {report.vllm.command}")
    raise OutOfMemoryBudgetError(
        f"{report.model} at {report.ctx} ctx x {report.concurrency} seq needs "
        f"{human_bytes(report.total_bytes)} but {report.device} has "
        f"{human_bytes(report.available_bytes)}" + (f"; {'; '.join(hints)}" if hints else "")
    )


def _as_session_flags(change: str) -> str | None:
    """A budget suggestion in the flags of the commands that load a model (chat, generate,
    serve, bench, embed): sequences are their --slots; --dtype only generate and serve have, so
    the hint says so."""
    if "--dtype" in change:
        change += " (generate, serve)"
    return change.replace("--concurrency", "--slots")
