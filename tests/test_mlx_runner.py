"""MLXRunner (mlx[cpu] on Linux, Metal on a Mac): parity with the torch runner and the numpy
reference, batching, rollback and prefix reuse, the Runner protocol's invariants and errors, and
memory. Weight forms (dtypes, quantization, GGUF blocks, MLX repos): test_mlx_weights.py.

MLX on CPU is slow, so everything here uses tiny models.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")


from localinfer.backends.base import MemoryReport, Runner, RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.mlx.batch_layout import SMALL_ITEM, layout_batch  # noqa: E402
from localinfer.backends.mlx.quant_spec import QuantSpec, parse_quant  # noqa: E402
from localinfer.backends.mlx.runner import (  # noqa: E402
    MLXRunner,
    recommended_working_set,
)
from localinfer.errors import ContextOverflowError, UnsupportedModelError  # noqa: E402
from localinfer.loading.model_config import RopeScaling  # noqa: E402
from tests.mlx_helpers import ARCHS, feed, make_runner, torch_runner  # noqa: E402
from tests.reference_numpy import reference_logits  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402

pytestmark = pytest.mark.mlx

# -- parity ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_parity_with_torch_runner(arch):
    """Teacher-forced logits, prefill and then decode steps, equal the torch runner's (fp32).

    60 tokens: past mistral's 32-token window, so the sliding mask is exercised too."""
    model = tiny_model(arch)
    tokens = random_tokens(60)
    chunks = [40, 1, 1, 5, 13]
    ours = feed(make_runner(model), 0, tokens, chunks)
    theirs = feed(torch_runner(model), 0, tokens, chunks)
    assert ours.shape == (60, 256) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_matches_numpy_reference(arch):
    """The same against the independent numpy forward (also runs where torch is absent)."""
    model = tiny_model(arch, seed=3)
    tokens = random_tokens(40, seed=4)
    ours = feed(make_runner(model), 0, tokens, [17, 1, 22])
    expected = reference_logits(model.config, model.weights, tokens)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_rope_scaling_llama3_matches_reference():
    scaling = RopeScaling("llama3", factor=8.0, original_max_position_embeddings=16)
    model = tiny_model("llama", rope_scaling=scaling, rope_theta=500000.0)
    tokens = random_tokens(50)
    ours = feed(make_runner(model), 0, tokens)
    expected = reference_logits(model.config, model.weights, tokens)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


# -- batching, rollback, prefix reuse -------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_single(arch):
    """Slots at different positions in one forward (a prefill chunk, a decode step, a 4-token
    verify on a non-adjacent slot) give the logits each gives alone."""
    model = tiny_model(arch)
    history = {
        0: random_tokens(30, seed=5),
        1: random_tokens(9, seed=6),
        3: random_tokens(44, seed=7),
    }
    new = {0: random_tokens(20, seed=8), 1: random_tokens(1, seed=9), 3: random_tokens(4, seed=10)}
    batched = make_runner(model)
    for slot, toks in history.items():
        feed(batched, slot, toks)
    batch = [
        SlotWork(slot, tuple(new[slot]), len(history[slot]), "all") for slot in (3, 0, 1)
    ]  # out of slot order on purpose: results come back in batch order
    together = batched.forward(batch)
    for work, got in zip(batch, together, strict=True):
        alone = make_runner(model)
        feed(alone, work.slot, history[work.slot])
        (expected,) = alone.forward([work])
        assert got.shape == (len(work.tokens), 256)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert batched.slot_length(work.slot) == len(history[work.slot]) + len(work.tokens)


def test_decode_batch_of_every_slot_and_last_logits():
    model = tiny_model("qwen2")
    runner, solo = make_runner(model, slots=4), make_runner(model, slots=4)
    prompts = [random_tokens(5 + 7 * s, seed=s) for s in range(4)]
    for s, p in enumerate(prompts):
        feed(runner, s, p)
        feed(solo, s, p)
    out = runner.forward([SlotWork(s, (s + 10,), len(p)) for s, p in enumerate(prompts)])
    for s, p in enumerate(prompts):
        assert out[s].shape == (1, 256)
        (expected,) = solo.forward([SlotWork(s, (s + 10,), len(p))])
        np.testing.assert_allclose(out[s], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_rollback_refeed_gives_same_logits(arch):
    """Speculative rollback: truncate past rejected tokens, re-feed, get the same logits."""
    model = tiny_model(arch)
    runner = make_runner(model)
    prompt, draft = random_tokens(34, seed=11), random_tokens(6, seed=12)
    feed(runner, 2, prompt)
    first = feed(runner, 2, draft)
    runner.truncate(2, len(prompt) + 2)  # keep two accepted draft tokens
    assert runner.slot_length(2) == len(prompt) + 2
    again = feed(runner, 2, draft[2:])
    np.testing.assert_allclose(again, first[2:], rtol=1e-5, atol=1e-5)
    # Different tokens after the rollback point equal a fresh run of that history.
    runner.truncate(2, len(prompt))
    other = random_tokens(6, seed=13)
    fresh = make_runner(model)
    feed(fresh, 0, prompt)
    np.testing.assert_allclose(feed(runner, 2, other), feed(fresh, 0, other), rtol=1e-5, atol=1e-5)


def test_prefix_reuse_truncate_to_shared_prefix():
    """A slot holding system+A, truncated to the shared system prompt and fed B, equals a cold
    slot fed system+B."""
    model = tiny_model("qwen3")
    system, a, b = (
        random_tokens(25, seed=20),
        random_tokens(15, seed=21),
        random_tokens(12, seed=22),
    )
    runner = make_runner(model)
    feed(runner, 1, system + a)
    runner.truncate(1, len(system))
    warm = feed(runner, 1, b)
    cold = feed(make_runner(model), 1, system + b)[len(system) :]
    np.testing.assert_allclose(warm, cold, rtol=1e-5, atol=1e-5)
    runner.release(1)
    assert runner.slot_length(1) == 0
    np.testing.assert_allclose(
        feed(runner, 1, system + b)[len(system) :], cold, rtol=1e-5, atol=1e-5
    )


def test_layout_groups_short_items_and_isolates_long_ones():
    batch = [
        SlotWork(2, (1,), 5),
        SlotWork(0, tuple(range(SMALL_ITEM + 4)), 0, "all"),
        SlotWork(5, (1, 2, 3), 7, "all"),
    ]
    layout = layout_batch(batch)
    small, large = layout.groups
    assert small.slots == (2, 5) and small.q_len == 3 and not small.dense
    assert not small.contiguous and small.kv_len == 10
    assert large.slots == (0,) and large.dense and large.mask is not None
    assert layout.logit_rows[0] == (0,)  # the decode step, packed first
    assert layout.logit_rows[2] == (1, 2, 3)
    assert layout.logit_rows[1] == tuple(range(4, 4 + SMALL_ITEM + 4))
    # A lone decode step at the end of its slot sees every key: no mask at all.
    (only,) = layout_batch([SlotWork(0, (1,), 9)]).groups
    assert only.mask is None and only.dense


# -- invariants and errors ------------------------------------------------------------------------


def test_protocol_info_and_errors():
    model = tiny_model("llama")
    runner = make_runner(model, slots=2, max_ctx=16)
    assert isinstance(runner, Runner)
    assert runner.info.backend == "mlx" and runner.info.quant == "fp32"
    assert runner.info.device == "cpu" and runner.info.vocab_size == 256
    assert runner.forward([]) == []
    with pytest.raises(ContextOverflowError):
        runner.forward([SlotWork(0, tuple(range(17)), 0)])
    with pytest.raises(ValueError, match="start_pos"):
        runner.forward([SlotWork(0, (1,), 3)])
    with pytest.raises(ValueError, match="out of range"):
        runner.forward([SlotWork(0, (256,), 0)])
    with pytest.raises(ValueError, match="twice"):
        runner.forward([SlotWork(1, (1,), 0), SlotWork(1, (2,), 0)])
    assert runner.slot_length(0) == 0  # nothing was written by the failed calls
    feed(runner, 0, [1, 2, 3])
    with pytest.raises(ValueError, match="cannot truncate"):
        runner.truncate(0, 4)
    with pytest.raises(ValueError, match="out of range"):
        runner.slot_length(2)
    runner.close()
    runner.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        runner.forward([SlotWork(0, (1,), 3)])


def test_unsupported_configurations():
    with pytest.raises(UnsupportedModelError, match="dtype"):
        make_runner(tiny_model("llama"), dtype="float64")
    with pytest.raises(UnsupportedModelError, match="gemma3"):
        make_runner(tiny_model("gemma3"))
    with pytest.raises(UnsupportedModelError, match="cannot quantize"):
        make_runner(tiny_model("llama"), quant="Q4_K_M")
    if not mx.metal.is_available():
        from localinfer.errors import BackendUnavailableError

        with pytest.raises(BackendUnavailableError, match="Metal"):
            make_runner(tiny_model("llama"), device="metal")


def test_parse_quant():
    assert parse_quant(None, "Q4_1") == QuantSpec("native")
    assert parse_quant("q4_1", "Q4_1") == QuantSpec("native")
    assert parse_quant("none", "Q4_1") == QuantSpec("float")
    assert parse_quant("int4", "F16") == QuantSpec("affine", 4, 32, mixed=True)
    assert parse_quant("int8-g32", "F16") == QuantSpec("affine", 8, 32)
    assert parse_quant("mlx-4bit-g128", "F16") == QuantSpec("affine", 4, 128)
    assert parse_quant("Q8_0", "F16") == QuantSpec("affine", 8, 32)
    with pytest.raises(UnsupportedModelError, match="group size"):
        parse_quant("int4-g48", "F16")


def test_recommended_working_set():
    size = recommended_working_set()
    if mx.metal.is_available():
        assert isinstance(size, int) and size > 0
    else:
        assert size is None


def test_selected_through_backends_select():
    from localinfer.backends.select import choose_backend
    from localinfer.backends.select import create_runner as select_create

    choice = choose_backend("mlx", model_format="safetensors")
    runner = select_create(tiny_model("llama"), RunnerConfig(slots=1, max_ctx=8), choice)
    assert isinstance(runner, MLXRunner) and "mlx" in choice.notice
    (logits,) = runner.forward([SlotWork(0, (1, 2), 0)])
    assert logits.shape == (1, 256)


# -- memory -----------------------------------------------------------------------------------


def test_memory_report_is_measured():
    model = tiny_model("mistral")
    runner = make_runner(model, slots=3, max_ctx=64)
    c = model.config
    report = runner.memory()
    assert isinstance(report, MemoryReport) and report.device == runner.info.device
    # The allocator's own counts: at least the arrays' bytes, at most one page of rounding more
    # per array (Metal allocates in 16 KiB pages; the CPU allocator counts exactly).
    page = 16384
    kv = 2 * c.n_layers * 3 * c.n_kv_heads * 64 * c.head_dim * 4  # fp32 K and V, every cell
    assert kv <= report.kv_cache <= kv + 2 * c.n_layers * page
    arrays = runner._model.weights.arrays()
    held = sum(a.nbytes for a in arrays)
    assert held >= model.weights.nbytes()  # float32 file -> float32 arrays (q|k|v fused)
    assert held <= report.weights <= held + len(arrays) * page
    before = report.overhead
    feed(runner, 0, random_tokens(50))
    after = runner.memory().overhead
    # The largest forward's activations show up: at least its logits (50 x 256 float32).
    assert after >= before + 50 * 256 * 4


def test_runner_used_from_another_thread():
    """The engine builds the runner on one thread and drives it from its own."""
    model = tiny_model("llama")
    runner = make_runner(model)
    tokens = random_tokens(12)
    here = feed(runner, 0, tokens)
    there: dict[str, np.ndarray] = {}
    worker = threading.Thread(target=lambda: there.setdefault("x", feed(runner, 1, tokens)))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(there["x"], here)


# Run in a fresh interpreter: a test process's other mappings of the same file (a llama.cpp
# runner's, a fixture's model) would be counted with the MLX runner's.
_RESIDENT_CHILD = """
import json
import mlx.core as mx
import numpy as np
from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.mlx.runner import create_runner
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

path = str(embedded_model_path().resolve())
runner = create_runner(load_model(embedded_model_path()), RunnerConfig(slots=1, max_ctx=64))
resident, inside = 0, False
with open("/proc/self/smaps", encoding="utf-8") as smaps:
    for line in smaps:
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
            inside = len(head) >= 6 and head[5] == path
        elif inside and head[:1] == ["Rss:"]:
            resident += int(head[1]) * 1024
cache = mx.get_cache_memory()
(logits,) = runner.forward([SlotWork(0, (1, 2, 3, 4), 0)])
print(json.dumps({"resident": resident, "cache": cache, "finite": bool(np.isfinite(logits).all())}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_the_load_leaves_no_file_pages_or_freed_buffers_resident():
    """Once the weights are MLX arrays, the GGUF's pages the load read leave the process (they
    made RSS grow by the whole file beside the weights' copy) and MLX's cache of what the load
    freed is handed back; the runner still reads the file where it must, as before."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _RESIDENT_CHILD], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["resident"] < 2**20  # of 94 MiB read
    assert seen["cache"] == 0
    assert seen["finite"]


def test_fill_synthetic_sets_a_slots_cells_for_measurements():
    """`budget --verify` fills slot 0 to the context's last chunk so that chunk's attention
    spans every cell, as the budget counts it: a length change over the preallocated cache."""
    runner = make_runner(tiny_model("llama"), slots=2, max_ctx=64)
    runner.fill_synthetic(1, 48)
    assert (runner.slot_length(0), runner.slot_length(1)) == (0, 48)
    (logits,) = runner.forward([SlotWork(1, tuple(random_tokens(16)), 48)])
    assert np.isfinite(logits).all() and runner.slot_length(1) == 64
    with pytest.raises(ValueError):
        runner.fill_synthetic(0, 65)
    with pytest.raises(ValueError):
        runner.fill_synthetic(2, 8)
