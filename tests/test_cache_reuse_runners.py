"""The runners' cache splice (``runner.kv_cache.splice``: KVSplicer, behind --cache-reuse) on
torch, llama.cpp and MLX with tiny random models.

- Stored keys are turned exactly: the torch and MLX caches' moved keys equal RoPE applied at the
  new positions to the same pre-RoPE keys (overlapping ranges, both directions, bf16 too), and
  values move unchanged.
- One layer, where a token's keys and values depend on nothing before it: a spliced slot (new
  tokens, chunks moved up and down) gives the logits of a cold prefill of the spliced tokens.
- Any depth: a move by 0 changes nothing; a move by delta and back gives the logits of before.
- Chunks that do not fit the slot raise before it changes.

Through the Engine on these runners: test_cache_reuse_engine.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import (
    KVSplicer,
    MovedChunk,
    Runner,
    RunnerConfig,
    SlotWork,
    kv_splicer,
)
from localinfer.backends.kv_splice import CellMove
from localinfer.backends.rope_tables import inverse_frequencies, rope_tables
from tests.prefix_reuse_helpers import seq
from tests.test_engine_model import ByteTokenizer
from tests.tiny import tiny_config, tiny_model

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
BACKENDS = ["torch", "llamacpp", "mlx"]
MOVES = [CellMove(10, 30, 14), CellMove(40, 52, 36), CellMove(60, 70, 60)]  # up, down, still


def make_runner(backend: str, arch: str, layers: int, tmp_path: Path) -> Runner:
    config = RunnerConfig(slots=2, max_ctx=192, threads=1)
    if backend == "torch":
        from localinfer.backends.torch.runner import TorchRunner

        model = tiny_model(arch, seed=1, n_layers=layers, tokenizer=ByteTokenizer(eos_ids=(2,)))
        return TorchRunner(model, config)
    if backend == "mlx":
        pytest.importorskip("mlx.core")
        from localinfer.backends.mlx.runner import MLXRunner

        model = tiny_model(arch, seed=1, n_layers=layers, tokenizer=ByteTokenizer(eos_ids=(2,)))
        return MLXRunner(model, config)
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from tests.llamacpp_helpers import tiny_setup

    _, _, model = tiny_setup(tmp_path, arch, seed=1, n_layers=layers)
    return LlamaCppRunner(model, config)


def assert_close(backend: str, got: np.ndarray, want: np.ndarray) -> None:
    """torch and MLX: float32 rounding of the turned keys. llama.cpp: its F16 cache is turned and
    rounded again, and its kernels differ by batch size (test_prefix_reuse_runners.py)."""
    scale = float(np.abs(want).max())
    rel = 2e-3 if backend == "llamacpp" else 2e-6
    err = float(np.abs(got - want).max())
    assert err <= rel * scale, f"{backend}: max |diff| {err:.3g} at scale {scale:.3g}"


def splicer(runner: Runner) -> KVSplicer:
    """The runner's KV cache, which every runner here has, and which splices."""
    kv = kv_splicer(runner)
    assert kv is not None
    return kv


def follow_logits(runner: Runner, slot: int, follow: tuple[int, ...]) -> np.ndarray:
    start = runner.slot_length(slot)
    return runner.forward([SlotWork(slot, follow, start, "all")])[0]


# -- keys turned exactly (cache level) ----------------------------------------------------------


def moved_positions(length: int) -> tuple[np.ndarray, np.ndarray]:
    """Each position's entry after MOVES: where it came from (-1: untouched)."""
    came_from = np.full(length, -1)
    for m in MOVES:
        came_from[m.dst : m.dst + m.n] = np.arange(m.src, m.end)
    return came_from, np.flatnonzero(came_from >= 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_moved_keys_are_rope_at_the_new_positions(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    from localinfer.backends.torch.kv_cache import StaticKVCache, move_cells
    from localinfer.backends.torch.rope import apply_rope

    config = tiny_config("llama", rope_theta=500.0)
    tdtype = getattr(torch, dtype)
    cos, sin = (torch.from_numpy(t).float() for t in rope_tables(config, 96))
    cache = StaticKVCache(2, 2, config.n_kv_heads, 96, config.head_dim, tdtype, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    pre = torch.randn(96, config.n_kv_heads, config.head_dim, generator=gen)  # pre-RoPE keys
    values = torch.randn(96, config.n_kv_heads, config.head_dim, generator=gen)
    slots, pos = torch.full((96,), 1), torch.arange(96)
    for layer in range(2):
        cache.write(
            layer,
            slots,
            pos,
            apply_rope(pre, cos[:, None], sin[:, None]).to(tdtype),
            values.to(tdtype),
        )
    before_k, before_v = cache.keys[1].clone(), cache.values[1].clone()
    move_cells(cache, 1, MOVES, inverse_frequencies(config))
    came_from, moved = moved_positions(96)
    src = torch.from_numpy(came_from[moved])
    dst = torch.from_numpy(moved)
    want = apply_rope(pre[src], cos[dst][:, None], sin[dst][:, None])  # [M, kv, d]
    got = cache.keys[1][1][:, dst].transpose(0, 1).float()
    tol = 1e-5 if dtype == "float32" else 2e-2
    torch.testing.assert_close(got, want, atol=tol * 4, rtol=tol)
    assert torch.equal(cache.values[1][1][:, dst].transpose(0, 1), values[src].to(tdtype))
    untouched = torch.from_numpy(np.setdiff1d(np.arange(96), moved))
    assert torch.equal(cache.keys[1][1][:, untouched], before_k[1][:, untouched])
    assert torch.equal(cache.keys[1][0], before_k[0]) and torch.equal(
        cache.values[1][0], before_v[0]
    )


def test_mlx_moved_keys_are_rope_at_the_new_positions() -> None:
    mx = pytest.importorskip("mlx.core")
    from localinfer.backends.mlx.kv_cache import SlotKVCache, move_cells
    from localinfer.backends.mlx.rope import apply_rope

    config = tiny_config("llama", rope_theta=500.0)
    cos, sin = (mx.array(t.astype(np.float32)) for t in rope_tables(config, 96))
    cache = SlotKVCache(1, 2, config.n_kv_heads, 96, config.head_dim, mx.float32)
    rng = np.random.default_rng(0)
    pre = rng.standard_normal((96, config.n_kv_heads, config.head_dim)).astype(np.float32)
    values = rng.standard_normal(pre.shape).astype(np.float32)
    keys = apply_rope(mx.array(pre), cos[:, None], sin[:, None])
    cache.write(0, mx.full((96,), 1, dtype=mx.int32), mx.arange(96), keys, mx.array(values))
    move_cells(cache, 1, MOVES, inverse_frequencies(config))
    came_from, moved = moved_positions(96)
    want = apply_rope(
        mx.array(pre[came_from[moved]]),
        cos[mx.array(moved)][:, None],
        sin[mx.array(moved)][:, None],
    )
    got = np.asarray(cache.keys[0][1]).transpose(1, 0, 2)  # [pos, kv, d]
    np.testing.assert_allclose(got[moved], np.asarray(want), rtol=1e-5, atol=4e-5)
    np.testing.assert_array_equal(
        np.asarray(cache.values[0][1]).transpose(1, 0, 2)[moved], values[came_from[moved]]
    )
    untouched = np.setdiff1d(np.arange(96), moved)
    np.testing.assert_array_equal(got[untouched], np.asarray(keys)[untouched])


# -- whole runners ------------------------------------------------------------------------------

RunnerMaker = Callable[[int], Runner]


@pytest.fixture
def maker(request: pytest.FixtureRequest, tmp_path: Path) -> RunnerMaker:
    backend, arch = request.param
    return lambda layers: make_runner(backend, arch, layers, tmp_path)


PAIRS = [(b, a) for b in BACKENDS for a in ARCHS]


@pytest.mark.parametrize("maker", PAIRS, indirect=True, ids=[f"{b}-{a}" for b, a in PAIRS])
def test_one_layer_splice_equals_a_cold_prefill_of_the_layout(maker: RunnerMaker) -> None:
    runner = maker(1)
    backend = runner.info.backend
    old = seq(120, 1)
    runner.forward([SlotWork(0, tuple(old), 0)])
    x, y = tuple(seq(7, 2)), tuple(seq(3, 3))
    # keep 30; x then old[50:80] (moved down by 13); y then old[85:110] (down by 15); the rest of
    # old is dropped.
    chunks = [MovedChunk(x, 50, 80), MovedChunk(y, 85, 110)]
    splicer(runner).splice(0, 30, chunks)
    spliced = old[:30] + list(x) + old[50:80] + list(y) + old[85:110]
    assert runner.slot_length(0) == len(spliced)
    follow = tuple(seq(6, 4))
    got = follow_logits(runner, 0, follow)
    want = runner.forward([SlotWork(1, tuple(spliced) + follow, 0, "all")])[0][len(spliced) :]
    assert_close(backend, got, want)
    # A chunk moved up past its old place (an insertion longer than a deletion).
    runner.release(0)
    runner.forward([SlotWork(0, tuple(old), 0)])
    splicer(runner).splice(0, 30, [MovedChunk(tuple(seq(20, 5)), 35, 100)])
    spliced = old[:30] + seq(20, 5) + old[35:100]
    runner.release(1)
    want = runner.forward([SlotWork(1, tuple(spliced) + follow, 0, "all")])[0][len(spliced) :]
    assert_close(backend, follow_logits(runner, 0, follow), want)
    runner.close()


@pytest.mark.parametrize("maker", PAIRS, indirect=True, ids=[f"{b}-{a}" for b, a in PAIRS])
def test_a_move_by_zero_changes_nothing_and_there_and_back_restores(maker: RunnerMaker) -> None:
    runner = maker(2)
    backend = runner.info.backend
    old, follow = tuple(seq(90, 1)), tuple(seq(5, 2))
    runner.forward([SlotWork(0, old, 0)])
    before = follow_logits(runner, 0, follow)
    runner.truncate(0, 90)
    splicer(runner).splice(0, 40, [MovedChunk((), 40, 90)])
    assert runner.slot_length(0) == 90
    np.testing.assert_array_equal(follow_logits(runner, 0, follow), before)
    runner.truncate(0, 90)
    # Up by 11, after new tokens.
    splicer(runner).splice(0, 40, [MovedChunk(tuple(seq(11, 3)), 40, 90)])
    assert runner.slot_length(0) == 101
    splicer(runner).splice(0, 40, [MovedChunk((), 51, 101)])  # and back, the new tokens dropped
    assert runner.slot_length(0) == 90
    assert_close(backend, follow_logits(runner, 0, follow), before)
    runner.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_that_do_not_fit_raise_before_the_slot_changes(backend: str, tmp_path: Path) -> None:
    runner = make_runner(backend, "llama", 1, tmp_path)
    old, follow = tuple(seq(60, 1)), tuple(seq(4, 2))
    runner.forward([SlotWork(0, old, 0)])
    before = follow_logits(runner, 0, follow)
    bad = [
        (20, [MovedChunk((), 10, 30)]),  # starts inside the kept prefix
        (20, [MovedChunk((), 30, 61)]),  # ends past the slot's cells
        (20, [MovedChunk((), 40, 50), MovedChunk((), 30, 35)]),  # not ascending
        (61, []),  # keeps more than the slot holds
        (20, [MovedChunk(tuple(seq(160, 3)), 30, 60)]),  # beyond max_ctx
    ]
    for keep, chunks in bad:
        runner.truncate(0, 60)
        with pytest.raises(ValueError, match="splice"):
            splicer(runner).splice(0, keep, chunks)
        assert runner.slot_length(0) == 60
    runner.truncate(0, 60)
    np.testing.assert_array_equal(follow_logits(runner, 0, follow), before)
    runner.close()
