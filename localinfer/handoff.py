"""`localinfer export`: the same model, under the same name, on another engine (vLLM,
llama-server, Ollama), with the budget's numbers.

A user who outgrows localinfer moves to an engine built for clusters or to one a host already
runs; the clients should only change ``base_url``. So each plan carries the model id the clients
used (``serve``'s name for it, or ``--alias``), the context and concurrency the budget sized,
the KV cache type, the speculation asked for, and the tool-call and reasoning parsers the model's
chat template calls for. The vLLM plan takes its tensor/pipeline parallel sizes from the
budget's vLLM plan (budget/plan.py). Nothing is started here: the plan is printed, or written.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from localinfer.backend_budget import compute_budget
from localinfer.budget.compute import BudgetRequest
from localinfer.budget.memory import human_bytes
from localinfer.budget.model_facts import model_facts
from localinfer.budget.plan import vllm_plan_for
from localinfer.budget.report import BudgetReport
from localinfer.catalog import HFSource
from localinfer.errors import InvalidParameterError
from localinfer.facts.kv_dtype import kv_dtype
from localinfer.resolve import ResolvedModel, resolve_model
from localinfer.tools.family import ToolFamily, detect_family
from localinfer.tools.thinking import detect_thinking

TARGETS = ("vllm", "llama-server", "ollama")
DEFAULT_PORTS = {"vllm": 8000, "llama-server": 8080, "ollama": 11434}
# vLLM's --tool-call-parser for each tool-call family localinfer reads (tools/family.py).
VLLM_TOOL_PARSERS = {
    ToolFamily.HERMES: "hermes",
    ToolFamily.LLAMA3: "llama3_json",
    ToolFamily.MISTRAL: "mistral",
    ToolFamily.HARMONY: "openai",
}
# A model not on disk has no template to read: the catalog architecture's family.
ARCH_FAMILIES = {"qwen2": ToolFamily.HERMES, "qwen3": ToolFamily.HERMES,
                 "qwen3moe": ToolFamily.HERMES, "mistral": ToolFamily.MISTRAL}  # fmt: skip
NGRAM_TOKENS = 4  # tokens proposed a step, as localinfer's n-gram speculator starts


@dataclass(frozen=True, slots=True)
class ExportRequest:
    model: str
    target: str  # one of TARGETS
    ctx: int | None = None
    concurrency: int = 1
    kv_dtype: str | None = None
    alias: str | None = None  # the model id clients send; None: the name `serve` gives it
    draft: str = "off"  # off | ngram | a draft model (catalog name or file)
    host: str = "127.0.0.1"
    port: int | None = None
    rpc: tuple[str, ...] = ()  # llama-server: these `localinfer worker`s hold layers (--rpc)
    shares: tuple[float, ...] | None = None  # their shares, this machine's first (--tensor-split)


@dataclass(slots=True)
class HandoffPlan:
    target: str
    alias: str
    base_url: str
    command: list[str]  # the launch command's argv
    env: dict[str, str] = field(default_factory=dict)  # environment the command runs with
    files: dict[str, str] = field(default_factory=dict)  # file name -> text (Ollama's Modelfile)
    # Commands for the running server (Ollama's `create` talks to it): the script starts the
    # server in the background, waits until ``ready`` succeeds, runs these, then waits on it.
    after: list[list[str]] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        """The plan as a shell script: files written with here-documents, then the commands."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        lines = ["#!/bin/sh", "set -e"]
        if self.after and env:
            lines.append(f"export {env}")  # the client commands read it too (OLLAMA_HOST)
        for name, text in self.files.items():
            lines += [f"cat > {shlex.quote(name)} <<'EOF'", text.rstrip("\n"), "EOF"]
        if not self.after:
            return "\n".join([*lines, (env + " " if env else "") + shlex.join(self.command)]) + "\n"
        lines += [f"{shlex.join(self.command)} &", "server=$!",
                  f"until {shlex.join(self.ready)} >/dev/null 2>&1; do sleep 1; done"]  # fmt: skip
        lines += [shlex.join(argv) for argv in self.after]
        return "\n".join([*lines, 'wait "$server"']) + "\n"


def export_plan(request: ExportRequest) -> HandoffPlan:
    """The launch plan for ``request.target`` (InvalidParameterError for an unknown one)."""
    if request.target not in TARGETS:
        raise InvalidParameterError(
            f"unknown export target '{request.target}' (one of {', '.join(TARGETS)})"
        )
    resolved = resolve_model(request.model, None, assemble=False)
    alias = request.alias or resolved.name
    port = request.port or DEFAULT_PORTS[request.target]
    base_url = f"http://{request.host}:{port}/v1"
    template = _template_source(resolved)
    family = detect_family(template) if template else _arch_family(resolved)
    thinks = _reasoning(template, resolved)
    if request.target == "vllm":
        plan = _vllm(request, resolved, alias, port, family, thinks)
    elif request.target == "llama-server":
        plan = _llama_server(request, resolved, alias, port, thinks)
    else:
        plan = _ollama(request, resolved, alias)
    plan.base_url = base_url
    if template is None:
        plan.notes.append(
            "the chat template was not read (model not on disk): parsers from the catalog"
        )
    return plan


def _budget(request: ExportRequest, backend: str | None = None) -> BudgetReport:
    return compute_budget(
        BudgetRequest(
            request.model,
            request.ctx,
            request.concurrency,
            kv_dtype=request.kv_dtype,
            backend=backend,
        )
    )


def _vllm(
    request: ExportRequest,
    resolved: ResolvedModel,
    alias: str,
    port: int,
    family: ToolFamily,
    thinks: str | None,
) -> HandoffPlan:
    facts = model_facts(resolved)
    ctx = request.ctx or min(facts.arch.max_ctx, 2048)
    kv = kv_dtype(request.kv_dtype or "f16")
    vplan = vllm_plan_for(facts, ctx, request.concurrency, kv)
    if vplan is None:
        raise InvalidParameterError(f"{resolved.name} needs more than 64 x 80 GiB GPUs in vLLM")
    target, notes = _vllm_target(resolved)
    argv = ["vllm", "serve", target, "--served-model-name", alias,
            "--host", request.host, "--port", str(port),
            "--tensor-parallel-size", str(vplan.tensor_parallel_size)]  # fmt: skip
    if vplan.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(vplan.pipeline_parallel_size)]
    argv += ["--max-model-len", str(ctx), "--max-num-seqs", str(request.concurrency),
             "--gpu-memory-utilization", f"{vplan.gpu_memory_utilization:.2f}"]  # fmt: skip
    if vplan.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", vplan.kv_cache_dtype]
    parser = VLLM_TOOL_PARSERS.get(family)
    if parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if thinks is not None:
        argv += ["--reasoning-parser", thinks]
    speculative = _vllm_speculation(request.draft, resolved)
    if speculative is not None and vplan.pipeline_parallel_size == 1:
        argv += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    elif speculative is not None:
        notes.append("speculation left out: vLLM does not speculate with pipeline parallelism")
    gpus = vplan.gpus
    each = human_bytes(vplan.per_gpu_bytes)
    notes.insert(0, f"{gpus} GPU{'s' if gpus > 1 else ''} of 80 GiB, {each} each (budget)")
    return HandoffPlan("vllm", alias, "", argv, notes=notes)


def _vllm_target(resolved: ResolvedModel) -> tuple[str, list[str]]:
    """What vLLM loads: the original weights' repo where known, else the GGUF file (vLLM's GGUF
    loading is experimental and wants the tokenizer's repo beside it)."""
    entry = resolved.entry
    if entry is not None and isinstance(entry.source, HFSource):
        return entry.source.repo, []
    if resolved.kind in ("hub_remote", "hf_dir") and resolved.repo_id:
        return resolved.repo_id.split(":")[0], []
    if resolved.path is not None and resolved.kind != "gguf":
        return str(resolved.path), []
    where = str(resolved.path) if resolved.path is not None else resolved.name
    return where, ["vLLM reads a GGUF file experimentally; add --tokenizer ORG/REPO of the "
                   "original model, or serve its safetensors repo instead"]  # fmt: skip


def _vllm_speculation(draft: str, resolved: ResolvedModel) -> dict[str, object] | None:
    if draft in ("off", ""):
        return None
    if draft == "ngram":
        return {"method": "ngram", "num_speculative_tokens": NGRAM_TOKENS, "prompt_lookup_max": 4}
    name = _draft_name(draft, resolved)
    draft_model = resolve_model(name, None, assemble=False)
    target, _ = _vllm_target(draft_model)
    return {"model": target, "num_speculative_tokens": NGRAM_TOKENS}


def _llama_server(
    request: ExportRequest, resolved: ResolvedModel, alias: str, port: int, thinks: str | None
) -> HandoffPlan:
    path = resolved.require_path()
    if resolved.kind != "gguf":
        raise InvalidParameterError("llama-server runs GGUF files; export a GGUF model")
    report = _budget(request, backend="llamacpp")
    slots = report.concurrency
    argv = ["llama-server", "-m", str(path), "--alias", alias,
            "--host", request.host, "--port", str(port),
            # llama-server splits -c between its -np slots (each its own KV stream, as
            # localinfer's runner holds them): the budget's context per slot, times the slots.
            "-c", str(report.ctx * slots), "-np", str(slots), "--no-kv-unified",
            "--jinja"]  # fmt: skip
    if report.kv_dtype != "f16":
        argv += ["-ctk", report.kv_dtype, "-ctv", report.kv_dtype]
        if kv_dtype(report.kv_dtype).block > 1:
            argv += ["-fa", "on"]  # llama.cpp reads a quantized V cache only in flash attention
    if request.rpc:
        argv += _rpc_args(request)
    elif report.gpu_layers is not None and report.gpu_layers != report.layers:
        argv += ["-ngl", str(report.gpu_layers)]
    if thinks is not None:
        argv += ["--reasoning-format", "deepseek"]  # reasoning_content, as localinfer serves it
    if request.draft == "ngram":
        argv += ["--spec-type", "ngram-simple"]
    elif request.draft not in ("off", ""):
        draft = resolve_model(_draft_name(request.draft, resolved), None).require_path()
        argv += ["-md", str(draft), "--spec-draft-n-max", str(NGRAM_TOKENS)]
    notes = [_budget_note(report)]
    return HandoffPlan("llama-server", alias, "", argv, notes=notes)


def _rpc_args(request: ExportRequest) -> list[str]:
    """llama-server's own --rpc with the node plan's split (a `localinfer worker` speaks
    llama.cpp's RPC protocol, so llama-server uses it as it would rpc-server)."""
    from localinfer.rpc_nodes import node_budget

    shares = list(request.shares) if request.shares else None
    budget = BudgetRequest(request.model, request.ctx, request.concurrency,
                           kv_dtype=request.kv_dtype)  # fmt: skip
    plan = node_budget(budget, request.rpc, None, shares)
    total = sum(plan.split) or 1.0
    split = ",".join(f"{share / total:.4g}" for share in plan.split)
    return ["--rpc", ",".join(request.rpc), "-ngl", str(plan.gpu_layers), "-ts", split]


def _ollama(request: ExportRequest, resolved: ResolvedModel, alias: str) -> HandoffPlan:
    path = resolved.require_path()
    if resolved.kind != "gguf":
        raise InvalidParameterError("this export writes a Modelfile FROM a GGUF file")
    report = _budget(request, backend="llamacpp")
    modelfile = f"FROM {path}\nPARAMETER num_ctx {report.ctx}\n"
    env = {"OLLAMA_HOST": f"{request.host}:{request.port or DEFAULT_PORTS['ollama']}",
           "OLLAMA_NUM_PARALLEL": str(report.concurrency)}  # fmt: skip
    if report.kv_dtype != "f16":
        env |= {"OLLAMA_FLASH_ATTENTION": "1", "OLLAMA_KV_CACHE_TYPE": report.kv_dtype}
    notes = [_budget_note(report)]
    if request.draft not in ("off", ""):
        notes.append("Ollama does not speculate: --draft left out")
    return HandoffPlan(
        "ollama", alias, "", ["ollama", "serve"], env=env, files={"Modelfile": modelfile},
        after=[["ollama", "create", alias, "-f", "Modelfile"]], ready=["ollama", "list"],
        notes=notes,
    )  # fmt: skip


def _budget_note(report: BudgetReport) -> str:
    verdict = "fits" if report.fits else "does not fit"
    return (
        f"budget: {human_bytes(report.total_bytes)} at {report.ctx:,} ctx x {report.concurrency} "
        f"seq, KV {report.kv_dtype}; {verdict} this machine ({human_bytes(report.available_bytes)})"
    )


def _draft_name(draft: str, resolved: ResolvedModel) -> str:
    if draft != "auto":
        return draft
    entry = resolved.entry
    if entry is None or entry.draft is None:
        raise InvalidParameterError(f"--draft auto: {resolved.name} has no catalog draft model")
    return entry.draft


def _template_source(resolved: ResolvedModel) -> str | None:
    """The chat template of a model on disk (GGUF metadata or tokenizer_config.json)."""
    if not resolved.on_disk or resolved.path is None:
        return None
    from localinfer.loading.loader import load_model

    model = load_model(Path(resolved.path), name=resolved.name)
    template = model.chat_template
    return template.source if template is not None else None


def _arch_family(resolved: ResolvedModel) -> ToolFamily:
    entry = resolved.entry
    arch = entry.arch.arch if entry is not None else ""
    return ARCH_FAMILIES.get(arch, ToolFamily.GENERIC)


def _reasoning(template: str | None, resolved: ResolvedModel) -> str | None:
    """vLLM's reasoning parser for a thinking model (None: it does not think): ``qwen3`` for a
    template with the enable_thinking switch (Qwen3, SmolLM3), ``deepseek_r1`` for one without
    (R1 distills, QwQ: the output starts inside the block), ``openai_gptoss`` for harmony's
    channels (gpt-oss)."""
    if template is None:
        entry = resolved.entry
        return "qwen3" if entry is not None and entry.thinks else None
    found = detect_thinking(template)
    if found is None:
        return None
    if found.headers:
        return "openai_gptoss"
    return "qwen3" if found.toggle is not None else "deepseek_r1"
