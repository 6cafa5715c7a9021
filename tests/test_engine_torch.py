"""Batched = single through the engine on the real TorchRunner (fp32): tiny random models of each
architecture, and the embedded SmolLM2 model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.engine import Engine, Request, SamplingParams
from localinfer.loading.model import LoadedModel
from tests.test_engine_model import ByteTokenizer
from tests.tiny import tiny_model

torch_runner = pytest.importorskip("localinfer.backends.torch.runner")

PROMPTS = [
    [5, 17, 33, 9],
    [int(x) for x in (np.arange(70) * 7 % 250 + 3)],  # several prefill chunks
    [100],
    [int(x) for x in (np.arange(23) * 13 % 250 + 3)],
    [42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42],
]
MAX_TOKENS = [12, 6, 16, 9, 14]


def engine_model(arch: str) -> LoadedModel:
    """A tiny model with byte tokens, ending on tiny_config's eos id 2."""
    return tiny_model(arch, seed=1, path=Path("/dev/null"), tokenizer=ByteTokenizer(eos_ids=(2,)))


def solo_greedy(runner, prompt: list[int], max_tokens: int, eos: frozenset[int]) -> list[int]:
    """The runner driven directly, slot 0 alone, no engine."""
    runner.release(0)
    out = runner.forward([SlotWork(0, tuple(prompt), 0)])[0]
    tokens: list[int] = []
    while True:
        t = int(np.argmax(out[-1]))
        tokens.append(t)
        if t in eos or len(tokens) == max_tokens:
            runner.release(0)
            return tokens
        out = runner.forward([SlotWork(0, (t,), runner.slot_length(0))])[0]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_tiny_models_batched_equals_single(arch: str) -> None:
    model = engine_model(arch)
    runner = torch_runner.TorchRunner(model, RunnerConfig(slots=3, max_ctx=128))
    eos = frozenset(model.config.eos_token_ids)
    expected = [solo_greedy(runner, p, n, eos) for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    with Engine(runner, model.tokenizer, prefill_chunk=16) as engine:
        handles = [
            engine.submit(Request(p, SamplingParams(max_tokens=n)))
            for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)
        ]
        got = [list(h.result().token_ids) for h in handles]
    assert got == expected
    # Some answers must run long enough to overlap; eos everywhere would make this vacuous.
    assert sum(len(g) for g in got) >= 20


@pytest.fixture(scope="module")
def smol():
    loader = pytest.importorskip("localinfer.loading.loader")
    from localinfer.loading.embedded import embedded_model_path

    model = loader.load_model(embedded_model_path())
    # 2 slots for 3 prompts: one waits and takes the first freed slot.
    runner = torch_runner.TorchRunner(model, RunnerConfig(slots=2, max_ctx=256))
    yield model, runner
    runner.close()


def test_embedded_model_batched_equals_single(smol) -> None:
    model, runner = smol
    tok = model.tokenizer
    texts = [
        "The capital of France is",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "1, 2, 3, 4,",
    ]
    prompts = [tok.encode(t) for t in texts]
    eos = frozenset(tok.eos_ids)
    n = 5
    expected = [solo_greedy(runner, p, n, eos) for p in prompts]
    with Engine(runner, tok, prefill_chunk=8) as engine:
        handles = [engine.submit(Request(p, SamplingParams(max_tokens=n))) for p in prompts]
        results = [h.result() for h in handles]
    assert [list(r.token_ids) for r in results] == expected
    assert results[0].text.strip() != ""
