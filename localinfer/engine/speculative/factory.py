"""Turn a ``--draft`` choice into a Speculator: ``off``, ``ngram``, ``auto`` (the catalog's
recommended draft for the target) or a model spec (catalog name, file or directory)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer.engine.speculative.config import SpecConfig
from localinfer.engine.speculative.draft import DraftProposer, check_shared_tokenizer
from localinfer.engine.speculative.speculator import Speculator
from localinfer.errors import InvalidParameterError

if TYPE_CHECKING:
    from localinfer.backends.base import RunnerConfig
    from localinfer.catalog import CatalogEntry
    from localinfer.loading.model import LoadedModel

OFF = ("", "off", "none")

# Extra cost of one more token in a target forward, as a fraction of a one-token decode step.
# CPU figures from FACTS.md's decode table (k tokens in one forward vs k single steps):
# llama.cpp Q4_1 on 2 cores does 4 streams at 203 tok/s against 158 alone, so 4 tokens cost
# about 3.1 steps (~0.7 per extra token; scripts/bench-speculative measured 0.69-1.03 for
# k = 1..8 on 1 thread, median 0.77); torch fp32 is memory-bound, 8 streams at 141 tok/s
# against 28 alone (~0.09; the bench measured 0.05).
# A GPU verifies a handful of tokens for nearly the price of one.
VERIFY_COST = {("llamacpp", "cpu"): 0.75, ("torch", "cpu"): 0.1, ("mlx", "cpu"): 0.1}
GPU_VERIFY_COST = 0.02
# Most slots decoding at once while speculation still pays, from scripts/bench-speculative's
# busy-batch table on the embedded model (editing prompts on every slot, 1 thread, median of 3):
# llama.cpp 1.02x / 1.05x / 0.71x at 1 / 2 / 4 slots, torch fp32 7.4x / 1.65x / 0.93x (a
# 1-repeat run gave 1.22x at 4: close to break-even). GPUs: not measured here.
MAX_BUSY_SLOTS = {"llamacpp": 2, "torch": 2, "mlx": 2}

# Default cost of a draft-model step relative to a target decode step when the draft is a
# separate model; scripts/bench-speculative measures it for a given pair.
DRAFT_STEP_COST = 0.3


def default_config(backend: str, device: str, *, with_draft: bool = False) -> SpecConfig:
    """Speculation settings for a target on ``backend``/``device`` (see VERIFY_COST)."""
    if device.startswith(("cuda", "metal")):
        cost = GPU_VERIFY_COST
    else:
        cost = VERIFY_COST.get((backend, "cpu"), 0.3)
    return SpecConfig(
        verify_cost=cost,
        draft_cost=DRAFT_STEP_COST if with_draft else 0.0,
        max_busy_slots=MAX_BUSY_SLOTS.get(backend, 2),
    )


def make_speculator(
    draft: str | None,
    *,
    target: LoadedModel,
    target_entry: CatalogEntry | None,
    runner_config: RunnerConfig,
    backend: str | None,
    target_backend: str = "torch",
    config: SpecConfig | None = None,
) -> Speculator | None:
    """The Speculator for ``draft`` (None when off). A draft model is loaded and gets its own
    runner with the target's slots and context; its tokenizer must match the target's."""
    choice = (draft or "off").strip()
    if choice.lower() in OFF:
        return None
    device = runner_config.device
    if choice.lower() == "ngram":
        return Speculator(config or default_config(target_backend, device))
    if choice.lower() == "auto":
        if target_entry is None or target_entry.draft is None:
            raise InvalidParameterError(
                f"{target.name} has no recommended draft model in the catalog; "
                "use --draft ngram or name a draft model"
            )
        choice = target_entry.draft
    return Speculator(
        config or default_config(target_backend, device, with_draft=True),
        _draft_proposer(choice, target, runner_config, backend),
    )


def _draft_proposer(
    spec: str, target: LoadedModel, runner_config: RunnerConfig, backend: str | None
) -> DraftProposer:
    from localinfer.backends.select import create_runner
    from localinfer.loading.loader import load_model
    from localinfer.resolve import resolve_model

    resolved = resolve_model(spec)
    model = load_model(resolved.require_path(), name=resolved.name)
    check_shared_tokenizer(target.tokenizer, model.tokenizer, names=(target.name, model.name))
    if model.config.max_ctx < runner_config.max_ctx:
        raise InvalidParameterError(
            f"draft model {model.name} was trained for {model.config.max_ctx} tokens, less than "
            f"the context asked for ({runner_config.max_ctx})"
        )
    runner, _ = create_runner(model, runner_config, backend)
    return DraftProposer(runner, vocab_size=model.tokenizer.vocab_size)
