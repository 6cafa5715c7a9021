"""``KVTransfer`` (copy a prefix between slots, snapshot a slot to host bytes and restore it) on
the torch, llama.cpp and MLX runners' KV caches (``runner.kv_cache``), with tiny random models
and the embedded model.

- Copied = cold: a prefix copied into another slot and continued gives the logits of a slot that
  was fed the same tokens in the same forward sizes (bit for bit on torch and MLX), and of one
  cold prefill (within each backend's rounding); the source slot is untouched.
- Restored = cold: a snapshot restored into the slot after it was overwritten, or into another
  slot, continues as the original would; greedy decoding is token-identical for 20 tokens.
- Refusals: another model's or dtype's snapshot, a short or mislabelled payload, a prefix out of
  range, a slot copied onto itself: ValueError, and the target slot keeps what it held.
- 16-bit caches (bf16) restore bit for bit on torch and MLX.
- llama.cpp: a snapshot moves between contexts with and without flash attention (V stored
  transposed or not), and a transfer right after a splice waits for the decode that turns keys.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import KVCache, KVSnapshot, Runner, RunnerConfig, SlotWork
from tests.prefix_reuse_helpers import seq
from tests.test_engine_model import ByteTokenizer
from tests.tiny import tiny_model

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]
BACKENDS = ["torch", "llamacpp", "mlx"]
PAIRS = [(b, a) for b in BACKENDS for a in ARCHS]
IDS = [f"{b}-{a}" for b, a in PAIRS]

Maker = Callable[..., Runner]


def make_runner(
    backend: str, arch: str, tmp_path: Path, seed: int = 1, dtype: str = "float32"
) -> Runner:
    config = RunnerConfig(slots=3, max_ctx=192, threads=1, dtype=dtype)
    if backend in ("torch", "mlx"):
        if backend == "mlx":
            pytest.importorskip("mlx.core")
            from localinfer.backends.mlx.runner import MLXRunner as cls
        else:
            from localinfer.backends.torch.runner import TorchRunner as cls
        model = tiny_model(arch, seed=seed, tokenizer=ByteTokenizer(eos_ids=(2,)))
        return cls(model, config)
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from tests.llamacpp_helpers import tiny_setup

    folder = tmp_path / f"seed{seed}"
    folder.mkdir(exist_ok=True)
    _, _, model = tiny_setup(folder, arch, seed=seed)
    return LlamaCppRunner(model, config)


def cache(runner: Runner) -> KVCache:
    """The runner's KV cache: every runner here has one, with all of KVCache."""
    kv = getattr(runner, "kv_cache", None)
    assert isinstance(kv, KVCache)
    return kv


@pytest.fixture
def maker(request: pytest.FixtureRequest, tmp_path: Path) -> Maker:
    backend, arch = request.param
    return lambda **kw: make_runner(backend, arch, tmp_path, **kw)


def feed(runner: Runner, slot: int, *chunks: list[int] | tuple[int, ...]) -> np.ndarray:
    """Each chunk in its own forward after what the slot holds; the last one's logits, all rows."""
    out = np.empty(0)
    for chunk in chunks:
        start = runner.slot_length(slot)
        out = runner.forward([SlotWork(slot, tuple(chunk), start, "all")])[0]
    return out


def refill(runner: Runner, slot: int, *chunks: list[int]) -> np.ndarray:
    runner.release(slot)
    return feed(runner, slot, *chunks)


def greedy(runner: Runner, slot: int, logits: np.ndarray, n: int) -> list[int]:
    """``n`` tokens decoded greedily, one forward each, from the last row of ``logits``."""
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = feed(runner, slot, [out[-1]])
    return out


def assert_close(backend: str, got: np.ndarray, want: np.ndarray) -> None:
    """Against one cold prefill: torch rounds a matmul by how many rows it carries, llama.cpp's
    kernels change with the batch size (test_prefix_reuse_runners.py measured both)."""
    assert got.shape == want.shape
    scale = float(np.abs(want).max())
    rel = {"torch": 1e-5, "mlx": 1e-6}.get(backend, 2e-3)
    err = float(np.abs(got - want).max())
    assert err <= rel * scale, f"{backend}: max |diff| {err:.3g} at scale {scale:.3g}"


P, R, F = seq(60, 1), seq(20, 2), seq(6, 3)  # a prompt, its rest after a copied prefix, a follow


@pytest.mark.parametrize("maker", PAIRS, indirect=True, ids=IDS)
def test_a_copied_prefix_continues_as_a_cold_prefill(maker: Maker) -> None:
    runner = maker()
    backend = runner.info.backend
    feed(runner, 0, P)
    feed(runner, 1, seq(100, 4))  # dst held more than it gets: all of it is dropped
    cache(runner).copy_prefix(0, 1, 40)
    assert runner.slot_length(1) == 40 and runner.slot_length(0) == 60
    got = feed(runner, 1, R)
    runner.release(2)
    feed(runner, 2, P)
    runner.truncate(2, 40)
    np.testing.assert_array_equal(got, feed(runner, 2, R))
    assert_close(backend, got, refill(runner, 2, P[:40] + R)[40:])
    # The source is untouched and keeps decoding.
    np.testing.assert_array_equal(feed(runner, 0, F), refill(runner, 2, P, F))
    # The whole slot copied, over a slot that held less.
    refill(runner, 2, seq(5, 5))
    cache(runner).copy_prefix(0, 2, 66)
    assert runner.slot_length(2) == 66
    np.testing.assert_array_equal(feed(runner, 2, R), feed(runner, 0, R))
    runner.close()


@pytest.mark.parametrize("maker", PAIRS, indirect=True, ids=IDS)
def test_a_restored_snapshot_continues_as_the_original(maker: Maker) -> None:
    runner = maker()
    backend = runner.info.backend
    feed(runner, 0, P)
    whole, part = cache(runner).snapshot(0, 60), cache(runner).snapshot(0, 45)
    assert (whole.n_tokens, part.n_tokens) == (60, 45)
    assert whole.layout == part.layout == cache(runner).layout()
    assert runner.slot_length(0) == 60  # a snapshot leaves the slot as it was
    if backend != "llamacpp":  # raw rows: the size is per token
        assert whole.nbytes * 45 == part.nbytes * 60
    refill(runner, 0, seq(80, 5))  # the slot is overwritten with other tokens
    cache(runner).restore(0, whole)
    assert runner.slot_length(0) == 60
    want = refill(runner, 2, P, F)
    np.testing.assert_array_equal(feed(runner, 0, F), want)
    # Into another slot, a prefix of the original, continued by its own rest.
    feed(runner, 1, seq(9, 6))
    cache(runner).restore(1, part)
    assert runner.slot_length(1) == 45
    got = feed(runner, 1, P[45:] + F)
    runner.release(2)
    feed(runner, 2, P)
    runner.truncate(2, 45)
    np.testing.assert_array_equal(got, feed(runner, 2, P[45:] + F))
    assert_close(backend, got, refill(runner, 2, P + F)[45:])
    # Greedy decoding from a restored slot is token-identical to the original's.
    cache(runner).restore(1, whole)
    restored = greedy(runner, 1, feed(runner, 1, F), 20)
    assert restored == greedy(runner, 2, refill(runner, 2, P, F), 20)
    runner.close()


def assert_refused(runner: Runner, slot: int, call: Callable[[], object], match: str) -> None:
    """``call`` raises ValueError and ``slot`` keeps its length and what it continues with."""
    length = runner.slot_length(slot)
    with pytest.raises(ValueError, match=match):
        call()
    assert runner.slot_length(slot) == length


@pytest.mark.parametrize("maker", PAIRS[:: len(ARCHS)], indirect=True, ids=IDS[:: len(ARCHS)])
def test_refusals_leave_the_target_slot_as_it_was(maker: Maker) -> None:
    runner = maker()
    backend = runner.info.backend
    feed(runner, 0, P)
    feed(runner, 1, R)
    snap = cache(runner).snapshot(0, 60)
    assert_refused(runner, 1, lambda: cache(runner).copy_prefix(1, 1, 5), "both slot")
    assert_refused(runner, 1, lambda: cache(runner).copy_prefix(0, 1, 61), "cannot copy 61")
    assert_refused(runner, 1, lambda: cache(runner).copy_prefix(0, 1, 0), "cannot copy 0")
    assert_refused(runner, 0, lambda: cache(runner).copy_prefix(0, 3, 5), "out of range")
    assert_refused(runner, 1, lambda: cache(runner).snapshot(1, 21), "cannot take 21")
    assert_refused(runner, 2, lambda: cache(runner).snapshot(2, 1), "cannot take 1")
    short = KVSnapshot(snap.layout, snap.n_tokens, snap.payload[:-7])
    assert_refused(runner, 1, lambda: cache(runner).restore(1, short), "payload")
    relabelled = KVSnapshot(snap.layout, snap.n_tokens - 1, snap.payload)
    assert_refused(runner, 1, lambda: cache(runner).restore(1, relabelled), "payload")
    assert_refused(runner, 1, lambda: cache(runner).restore(1, KVSnapshot("x", 1, b"..")), "layout")
    too_long = KVSnapshot(snap.layout, 193, snap.payload)
    assert_refused(runner, 1, lambda: cache(runner).restore(1, too_long), "max_ctx")
    others = [maker(seed=2)]
    if backend != "llamacpp":
        others.append(maker(dtype="bfloat16"))
    for other in others:
        assert cache(other).layout() != cache(runner).layout()
        feed(other, 0, P)
        foreign = cache(other).snapshot(0, 60)
        assert_refused(runner, 1, lambda s=foreign: cache(runner).restore(1, s), "layout")
        other.close()
    # Slot 1 still continues as a slot that was only ever fed R.
    np.testing.assert_array_equal(feed(runner, 1, F), refill(runner, 2, R, F))
    runner.close()


# -- the embedded model -------------------------------------------------------------------------


# MLX on a CPU takes ~25 s for this one (48 one-token forwards of a 135M model).
EMBEDDED = [pytest.param(b, marks=pytest.mark.slow) if b == "mlx" else b for b in BACKENDS]


@pytest.mark.parametrize("backend", EMBEDDED)
def test_embedded_model_restored_and_copied_decode_as_cold(backend: str) -> None:
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    if backend == "mlx":
        pytest.importorskip("mlx.core")
    runner = _embedded_runner(backend, load_model(embedded_model_path()))
    tok = load_model(embedded_model_path()).tokenizer
    prompt = tok.encode(
        "The history of the city begins in the Roman era, when a small settlement grew along "
        "the river. Over the centuries, merchants, monks and soldiers shaped its streets.",
        add_special_tokens=True,
    )
    n = len(prompt)
    first = feed(runner, 0, prompt)
    snap = cache(runner).snapshot(0, n)
    cache(runner).copy_prefix(0, 1, n - 1)
    copied_first = feed(runner, 1, prompt[-1:])
    cold = greedy(runner, 0, first, 16)
    assert greedy(runner, 1, copied_first, 16) == cold
    refill(runner, 0, prompt[:7])
    cache(runner).restore(1, snap)
    assert greedy(runner, 1, first, 16) == cold
    runner.close()


def _embedded_runner(backend: str, model: object) -> Runner:
    config = RunnerConfig(slots=2, max_ctx=256, threads=1)
    if backend == "torch":
        from localinfer.backends.torch.runner import TorchRunner

        return TorchRunner(model, config)  # type: ignore[arg-type]
    if backend == "mlx":
        from localinfer.backends.mlx.runner import MLXRunner

        return MLXRunner(model, config)  # type: ignore[arg-type]
    from localinfer.backends.llamacpp.runner import LlamaCppRunner

    return LlamaCppRunner(model, config)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "llamacpp"])
def test_16_bit_rows_restore_exactly(backend: str, tmp_path: Path) -> None:
    runner = make_runner(backend, "qwen3", tmp_path, dtype="bfloat16")
    feed(runner, 0, P)
    snap = cache(runner).snapshot(0, 60)
    assert "bfloat16" in snap.layout
    refill(runner, 0, seq(30, 7))
    cache(runner).restore(1, snap)
    cache(runner).copy_prefix(1, 0, 50)
    np.testing.assert_array_equal(feed(runner, 1, F), refill(runner, 2, P, F))
    refill(runner, 2, P)
    runner.truncate(2, 50)
    np.testing.assert_array_equal(feed(runner, 0, F), feed(runner, 2, F))
    runner.close()


def test_llamacpp_snapshots_move_between_v_layouts(tmp_path: Path) -> None:
    # Without flash attention llama.cpp stores V transposed; a payload keeps V as its context
    # laid it out, and a restore into a context of the other kind turns it.
    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from tests.llamacpp_helpers import tiny_setup

    _, _, model = tiny_setup(tmp_path, "qwen2", seed=1)
    config = RunnerConfig(slots=2, max_ctx=192, threads=1)
    plain, flash = (LlamaCppRunner(model, config, flash_attn=fa) for fa in (False, True))
    assert cache(plain).layout() == cache(flash).layout()
    for a, b in ((plain, flash), (flash, plain)):
        feed(a, 0, P)
        snap = cache(a).snapshot(0, 50)
        cache(a).restore(1, snap)  # same context: exact
        np.testing.assert_array_equal(feed(a, 1, F), refill(a, 0, P[:50], F))
        cache(b).restore(0, snap)  # the other layout: the same cells, its own attention kernels
        assert_close("llamacpp", feed(b, 0, F), refill(b, 1, P[:50], F))
        a.release(0), a.release(1), b.release(0), b.release(1)
    plain.close(), flash.close()


def test_llamacpp_refuses_a_transfer_until_moved_keys_are_turned(tmp_path: Path) -> None:
    from localinfer.backends.base import MovedChunk

    runner = make_runner("llamacpp", "llama", tmp_path)
    feed(runner, 0, P)
    # Cells moved down by 10: llama.cpp turns their keys at the next decode.
    cache(runner).splice(0, 10, [MovedChunk((), 20, 40)])
    with pytest.raises(RuntimeError, match="splice"):
        cache(runner).snapshot(0, 30)
    feed(runner, 0, F)
    cache(runner).copy_prefix(0, 1, 36)
    cache(runner).copy_prefix(1, 2, 36)
    got = feed(runner, 1, R)
    np.testing.assert_array_equal(got, feed(runner, 2, R))
    # Slot 0 holds the same cells with gaps where the splice dropped some: attention visits
    # them in other blocks, so it rounds differently.
    assert_close("llamacpp", got, feed(runner, 0, R))
    runner.close()
