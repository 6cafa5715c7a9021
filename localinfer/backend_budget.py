"""The budget on localinfer's backends, and what a backend would refuse, for the modules that
import no backend (docs/layers.md): the commands, the TUI, the server and the budget itself.

The budget (budget/compute.py) costs the backend it is handed; this module hands it the one
backends/select.py plans for the device, with its framework-free profile. It reads profiles and
selection rules only: no framework is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.backends.select import backend_profile, choose_backend, planned_backend
from localinfer.budget import compute

if TYPE_CHECKING:
    from localinfer.backend_profile import BackendProfile
    from localinfer.budget.memory import DeviceMemory
    from localinfer.budget.model_facts import ModelFacts
    from localinfer.budget.report import BudgetReport, BudgetRequest


def planned_profile(
    device_kind: str,
    requested: str | None,
    model_format: str | None = None,
    file_quant: str | None = None,
    arch: str | None = None,
    kv_dtype: str | None = None,
) -> BackendProfile:
    """The profile of the backend the budget costs on ``device_kind`` (compute.PlanBackend)."""
    name = planned_backend(device_kind, requested, model_format, file_quant, arch, kv_dtype)
    return backend_profile(name)


def compute_budget(
    request: BudgetRequest, memory: DeviceMemory | None = None, facts: ModelFacts | None = None
) -> BudgetReport:
    """budget.compute.compute_budget on the backend select.py plans for the request's device."""
    return compute.compute_budget(request, planned_profile, memory, facts)


@dataclass(frozen=True, slots=True)
class DeviceBackend:
    """The backend a session would run a model on here, its device and its default dtype there."""

    name: str  # torch | llamacpp | mlx
    device: str  # cpu | cuda | metal
    dtype: str  # the compute dtype a runner uses when none is asked


def device_backend(
    requested: str | None, facts: ModelFacts | None = None, kv_dtype: str | None = None
) -> DeviceBackend:
    """What choose_backend picks on this machine for a model with ``facts`` (its format, file
    type and architecture; None: unknown), as a session would pick it."""
    if facts is None:
        choice = choose_backend(requested, kv_dtype=kv_dtype)
    else:
        fmt, quant, arch = facts.format, facts.native_quant, facts.arch.arch
        choice = choose_backend(requested, fmt, quant, arch, kv_dtype)
    return DeviceBackend(choice.name, choice.device, choice.profile.default_dtype(choice.device))


def kv_dtype_refusal(requested: str, kv_dtype: str) -> str | None:
    """Why backend ``requested`` (--backend) would refuse a KV cache of ``kv_dtype`` at its
    default dtype on its device, in its runner's words; None where it holds one."""
    backend = device_backend(requested)
    return backend_profile(backend.name).kv_dtype_refusal(kv_dtype, backend.dtype)


def step_prompt_tokens(backend: str) -> int:
    """The prompt tokens one engine step carries on ``backend`` by default: what its profile
    sizes one forward pass for, so the budget's compute buffers hold."""
    return backend_profile(backend).memory.prefill_chunk
