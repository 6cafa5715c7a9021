"""What the MLX runner tests share: a float32 runner with small defaults, chunked feeding, and a
torch runner on the same model to compare against."""

from __future__ import annotations

import numpy as np
import pytest

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.mlx.runner import MLXRunner, create_runner
from localinfer.loading.model import LoadedModel

ARCHS = ("llama", "mistral", "qwen2", "qwen3")


def make_runner(model: LoadedModel, **kw: object) -> MLXRunner:
    cfg: dict[str, object] = dict(slots=4, max_ctx=96, dtype="float32")
    cfg.update(kw)
    return create_runner(model, RunnerConfig(**cfg))  # type: ignore[arg-type]


def feed(runner, slot: int, tokens: list[int], chunks: list[int] | None = None) -> np.ndarray:
    """Feed tokens after the slot's cached ones, in chunks (logits="all"): [len(tokens), vocab]."""
    out, done = [], 0
    for size in chunks or [len(tokens)]:
        part = tuple(tokens[done : done + size])
        if not part:
            break
        (logits,) = runner.forward([SlotWork(slot, part, runner.slot_length(slot), "all")])
        out.append(logits)
        done += len(part)
    assert done == len(tokens)
    return np.concatenate(out)


def torch_runner(model: LoadedModel, **kw: object):
    pytest.importorskip("torch")
    from localinfer.backends.torch.runner import TorchRunner

    cfg: dict[str, object] = dict(slots=4, max_ctx=96, dtype="float32")
    cfg.update(kw)
    return TorchRunner(model, RunnerConfig(**cfg))  # type: ignore[arg-type]
