"""Turn a ``--draft`` choice into a Speculator: ``off``, ``ngram``, ``auto`` (the catalog's
recommended draft for the target) or a model spec (catalog name, file or directory)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer.engine.speculative.config import SpecConfig
from localinfer.engine.speculative.draft import DraftProposer, check_shared_tokenizer
from localinfer.engine.speculative.speculator import Speculator
from localinfer.errors import InvalidParameterError
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES

if TYPE_CHECKING:
    from localinfer.backends.base import RunnerConfig
    from localinfer.catalog import CatalogEntry
    from localinfer.loading.model import LoadedModel

OFF = ("", "off", "none")

# Verification cost model per backend on a CPU, in one-token decode steps: (per extra token,
# fixed extra of any multi-token forward); see SpecConfig. Measured by scripts/bench-speculative
# on the embedded SmolLM2-135M on the project's 2-core machine, a (k+1)-token forward after a
# 300-token prompt over a one-token one, k = 1..16, fit 1 + fixed + per_token * k:
# llama.cpp Q4_1, 2 threads: 2.00 / 2.29 / 3.56 / 5.24 / 9.16 at k = 1 / 2 / 4 / 8 / 16, fit
# 0.38-0.48 fixed + 0.47-0.48 per token (1 thread: 0.48-0.66 + 0.52-0.57). Its one-token path
# is a matrix-vector kernel and a batch is compute-bound on Q4_1 blocks, hence both parts.
# torch fp32 with the native kernels, 2 threads: 1.09 / 1.20 / 1.70 / 3.30 at k = 2 / 4 / 8 / 16,
# fit 0.12 per token, nothing fixed (1 thread: 0.16).
# torch on GGUF Q4_1 blocks (block_weights.py; the CPU default for the embedded model): a
# one-token step reads 5.6x fewer bytes than fp32, so each extra token weighs more: 1.23 / 1.44 /
# 2.00 / 3.74 / 6.61 at k = 1 / 2 / 4 / 8 / 16 (scripts/bench-speculative; bench-native-kernels
# part 3 agrees), fit 0.34 per token, nothing fixed.
VERIFY_COST = {
    ("llamacpp", "cpu"): (0.48, 0.45),
    ("torch", "cpu"): (0.14, 0.0),
    ("torch-blocks", "cpu"): (0.34, 0.0),
    ("mlx", "cpu"): (0.1, 0.0),
}
GPU_VERIFY_COST = 0.02
# Most slots decoding at once while speculation still pays, from scripts/bench-speculative's
# busy-batch table on the embedded model (editing prompts on every slot, 2 threads, median of
# 3): llama.cpp 1.51x / 1.04x at 1 / 2 slots, torch fp32 2.79x / 0.99x (earlier, 1 thread:
# llama.cpp 0.71x and torch 0.93x at 4). torch on Q4_1 blocks: 1.95x / 0.92x / 0.89x at
# 1 / 2 / 4 (its batched decode is cheap: a second slot's extra tokens are better spent on that
# slot's own step). GPUs: not measured here.
MAX_BUSY_SLOTS = {"llamacpp": 2, "torch": 2, "torch-blocks": 1, "mlx": 2}

# Default cost of a draft-model step relative to a target decode step when the draft is a
# separate model; scripts/bench-speculative measures it for a given pair.
DRAFT_STEP_COST = 0.3


def default_config(
    backend: str, device: str, *, with_draft: bool = False, weights: str | None = None
) -> SpecConfig:
    """Speculation settings for a target on ``backend``/``device`` (see VERIFY_COST); ``weights``:
    what the target runner holds (RunnerInfo.quant), which sets the torch CPU costs."""
    key = "torch-blocks" if backend == "torch" and weights in STORED_BLOCK_TYPES else backend
    if device.startswith(("cuda", "metal")):
        cost, fixed = GPU_VERIFY_COST, 0.0
    else:
        cost, fixed = VERIFY_COST.get((key, "cpu"), (0.3, 0.0))
    return SpecConfig(
        verify_cost=cost,
        verify_fixed=fixed,
        draft_cost=DRAFT_STEP_COST if with_draft else 0.0,
        max_busy_slots=MAX_BUSY_SLOTS.get(key, 2),
    )


def make_speculator(
    draft: str | None,
    *,
    target: LoadedModel,
    target_entry: CatalogEntry | None,
    runner_config: RunnerConfig,
    backend: str | None,
    target_backend: str = "torch",
    target_weights: str | None = None,
    config: SpecConfig | None = None,
) -> Speculator | None:
    """The Speculator for ``draft`` (None when off). A draft model is loaded and gets its own
    runner with the target's slots and context; its tokenizer must match the target's."""
    choice = (draft or "off").strip()
    if choice.lower() in OFF:
        return None
    device = runner_config.device
    if choice.lower() == "ngram":
        return Speculator(config or default_config(target_backend, device, weights=target_weights))
    if choice.lower() == "auto":
        if target_entry is None or target_entry.draft is None:
            raise InvalidParameterError(
                f"{target.name} has no recommended draft model in the catalog; "
                "use --draft ngram or name a draft model"
            )
        choice = target_entry.draft
    return Speculator(
        config or default_config(target_backend, device, with_draft=True, weights=target_weights),
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
