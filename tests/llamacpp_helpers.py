"""What the llama.cpp runner tests share: tiny random models written as GGUF files, a one-thread
runner config and random prompts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localinfer.backends.base import RunnerConfig
from localinfer.loading.model import DictWeights, LoadedModel
from localinfer.loading.model_config import ModelConfig
from tests.gguf_writer import write_tiny_gguf
from tests.model_files import file_model
from tests.tiny import tiny_config, tiny_weights


def tiny_setup(
    tmp_path: Path, arch: str = "llama", seed: int = 0, **overrides: object
) -> tuple[ModelConfig, DictWeights, LoadedModel]:
    """A tiny random model of ``arch`` written to ``tmp_path/tiny-<arch>.gguf``: its config, its
    weights and the LoadedModel a llama.cpp runner opens."""
    if arch == "mistral":  # llama.cpp's llama arch has no per-layer window: plain attention
        overrides = {"sliding_window": None, "sliding_layers": (), **overrides}
    config = tiny_config(arch, **overrides)
    weights = tiny_weights(config, seed)
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", config, weights)
    return config, weights, file_model(path, "F32", config)


def cfg(**kw: object) -> RunnerConfig:
    # One thread: the test machine is shared, and llama.cpp's spinning thread barrier collapses
    # when its threads are preempted. Numerics do not depend on the thread count.
    return RunnerConfig(**{"threads": 1, **kw})  # type: ignore[arg-type]


def prompt(n: int, seed: int, vocab: int = 49152, low: int = 100) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(low, vocab, n))
