"""llama.cpp's RPC workers as the commands reach them (docs/layers.md: front ends import no
backend; this is the way to llama.cpp's RPC code, through its profile): start one here
(`localinfer worker`), ask one its memory (`budget --rpc`, the session's node plan)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from localinfer.backends.llamacpp.profile import rpc_worker_memory, start_rpc_worker
from localinfer.errors import BackendUnavailableError, InvalidParameterError

if TYPE_CHECKING:
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.select import BackendChoice
    from localinfer.budget.compute import BudgetRequest
    from localinfer.budget.nodes import NodePlan
    from localinfer.loading.model import LoadedModel

__all__ = [
    "RpcOptions",
    "node_budget",
    "split_config",
    "parse_shares",
    "parse_workers",
    "rpc_worker_memory",
    "start_rpc_worker",
    "worker_free_memory",
]


@dataclass(frozen=True, slots=True)
class RpcOptions:
    """`--rpc` and `--tensor-split`: the workers a model is split across, and the shares."""

    workers: tuple[str, ...]
    shares: tuple[float, ...] | None = None  # one per machine, this one first; None: by memory


def rpc_options(rpc: str | None, tensor_split: str | None) -> RpcOptions | None:
    """The commands' --rpc and --tensor-split (None without --rpc)."""
    if not rpc:
        if tensor_split:
            raise InvalidParameterError("--tensor-split shares layers between --rpc workers")
        return None
    shares = parse_shares(tensor_split)
    return RpcOptions(parse_workers(rpc), tuple(shares) if shares else None)


def parse_workers(text: str) -> tuple[str, ...]:
    """``--rpc HOST:PORT[,HOST:PORT...]`` as a tuple, each checked for its shape."""
    workers = tuple(part.strip() for part in text.split(",") if part.strip())
    if not workers:
        raise InvalidParameterError("--rpc wants HOST:PORT[,HOST:PORT...]")
    for worker in workers:
        host, sep, port = worker.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidParameterError(f"--rpc: '{worker}' is not HOST:PORT")
    if len(set(workers)) != len(workers):
        raise InvalidParameterError("--rpc names a worker twice")
    return workers


def worker_free_memory(endpoint: str) -> int:
    """The bytes the worker at ``endpoint`` says it can hold; BackendUnavailableError naming it
    when it does not answer."""
    try:
        return rpc_worker_memory(endpoint)[1]
    except (OSError, ConnectionError) as exc:
        raise BackendUnavailableError(
            f"the llama.cpp RPC worker {endpoint} does not answer ({exc}); start it there with "
            "`localinfer worker --host ADDRESS`"
        ) from None


def parse_shares(text: str | None) -> list[float] | None:
    """``--tensor-split 1,2,1``: one share per node, this machine first."""
    if not text:
        return None
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        raise InvalidParameterError(
            f"--tensor-split wants numbers like 1,1,2, got '{text}'"
        ) from None
    if any(s < 0 for s in shares) or not any(shares[1:]):
        raise InvalidParameterError("--tensor-split: shares are >= 0 and some worker's is > 0")
    return shares


def node_budget(
    request: BudgetRequest,
    workers: tuple[str, ...] = (),
    sizes: list[int] | None = None,
    shares: list[float] | None = None,
) -> NodePlan:
    """The budget of ``request`` split by llama.cpp's RPC backend: over this machine and the
    running ``workers`` (each asked its free memory), or offline over machines of ``sizes``
    (this machine's first). The memory arithmetic is the single-machine budget's, per layer."""
    from dataclasses import replace

    from localinfer.backend_budget import compute_budget
    from localinfer.backends.llamacpp.profile import PROFILE
    from localinfer.budget.memory import cpu_memory, device_memory
    from localinfer.budget.model_facts import model_facts
    from localinfer.budget.nodes import NodeSpec, plan_nodes
    from localinfer.facts.kv_dtype import kv_dtype
    from localinfer.resolve import resolve_model

    if bool(workers) == bool(sizes):
        raise InvalidParameterError("a split budget takes either --rpc workers or --nodes sizes")
    if sizes is not None and len(sizes) < 2:
        raise InvalidParameterError("--nodes wants two sizes or more: this machine's first")
    local = sizes[0] if sizes else _local_memory(request.device, device_memory, cpu_memory)
    machine = replace(request, backend="llamacpp", device=f"cpu:{local}B")
    report = compute_budget(machine)
    if sizes:
        nodes = [NodeSpec("this machine", local)]
        nodes += [NodeSpec(f"node {i + 1}", size) for i, size in enumerate(sizes[1:], 1)]
    else:
        nodes = [NodeSpec("this machine", local)]
        nodes += [NodeSpec(w, worker_free_memory(w)) for w in workers]
    facts = model_facts(
        resolve_model(request.model, request.quant, assemble=False),
        online=request.online,
        mmproj=request.mmproj,
    )
    projector = facts.projector.weight_bytes if facts.projector is not None else 0
    return plan_nodes(facts, PROFILE, report.weights_bytes - projector, report.ctx,
                      report.concurrency, kv_dtype(report.kv_dtype), nodes, shares)  # fmt: skip


def _local_memory(device: str, device_memory, cpu_memory) -> int:  # noqa: ANN001
    """This machine's share: a --device SIZE when given, else the RAM available now."""
    if device not in ("auto", "cpu"):
        return device_memory(device).available
    return cpu_memory()[0]


def split_config(
    model: LoadedModel,
    config: RunnerConfig,
    choice: BackendChoice,
    rpc: RpcOptions,
    force: bool,
) -> tuple[RunnerConfig, BackendChoice]:
    """The runner's config split over this machine and ``rpc.workers`` as the node plan places
    the layers (llama.cpp only); OutOfMemoryBudgetError naming the machines that cannot hold
    their share, unless ``force``."""
    from localinfer.backends.select import choose_backend
    from localinfer.budget.compute import BudgetRequest
    from localinfer.budget.memory import human_bytes
    from localinfer.errors import OutOfMemoryBudgetError

    if choice.name != "llamacpp":
        if config.device != "cpu" or model.format != "gguf":
            raise InvalidParameterError("--rpc splits a GGUF model with llama.cpp on the CPU")
        arch = model.config.arch
        choice = choose_backend("llamacpp", model.format, model.file_quant, arch, config.kv_dtype)
    request = BudgetRequest(str(model.path), config.max_ctx, config.slots, kv_dtype=config.kv_dtype)
    plan = node_budget(request, rpc.workers, None, list(rpc.shares) if rpc.shares else None)
    over = [n for n in plan.nodes if not n.fits]
    if over and not force:
        text = "; ".join(
            f"{n.name} holds {human_bytes(n.total_bytes)} of {human_bytes(n.available_bytes)}"
            for n in over
        )
        raise OutOfMemoryBudgetError(
            f"{model.name} split over {len(plan.nodes)} machines: {text}; --tensor-split moves "
            "layers, --force loads it anyway"
        )
    where = ", ".join(f"{n.name}: {n.layer_text}" for n in plan.nodes)
    config = replace(config, rpc=rpc.workers, gpu_layers=plan.gpu_layers,
                     rpc_split=tuple(plan.split))  # fmt: skip
    return config, replace(choice, reason=f"{choice.reason}; split by llama.cpp RPC ({where})")
