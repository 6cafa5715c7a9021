"""LlamaCppRunner: batching, rollback, errors, memory and the Runner protocol, on the embedded
model and tiny random GGUF models (numerics against references: test_llamacpp_parity.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from localinfer.backends.base import Runner, RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.llamacpp.runner import LlamaCppRunner, create_runner  # noqa: E402
from localinfer.errors import (  # noqa: E402
    ContextOverflowError,
    ModelFileError,
    UnsupportedModelError,
)
from localinfer.loading.embedded import embedded_model_path  # noqa: E402
from localinfer.loading.model import LoadedModel  # noqa: E402
from tests.gguf_writer import finish_gguf  # noqa: E402
from tests.llamacpp_helpers import cfg, prompt, tiny_setup  # noqa: E402
from tests.model_files import file_model  # noqa: E402
from tests.tiny import tiny_config, tiny_weights  # noqa: E402

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    return file_model(embedded_model_path(), "Q4_1")


def greedy(
    runner: LlamaCppRunner,
    prompts: dict[int, tuple[int, ...]],
    steps: int,
    join_at: dict[int, int] | None = None,
) -> tuple[dict[int, list[int]], dict[int, list[np.ndarray]]]:
    """Greedy decode of every slot's prompt, all slots in one batch per step.

    A slot joins at step ``join_at[slot]`` (its whole prompt as one prefill item beside the others'
    decode tokens), as under continuous batching. Returns tokens and last-position logits per slot.
    """
    join_at = join_at or dict.fromkeys(prompts, 0)
    tokens: dict[int, list[int]] = {s: [] for s in prompts}
    logits: dict[int, list[np.ndarray]] = {s: [] for s in prompts}
    for step in range(steps + max(join_at.values())):
        batch = []
        for slot, p in prompts.items():
            if step < join_at[slot] or len(tokens[slot]) >= steps:
                continue
            if step == join_at[slot]:
                batch.append(SlotWork(slot, p, 0))
            else:
                batch.append(SlotWork(slot, (tokens[slot][-1],), runner.slot_length(slot)))
        for work, out in zip(batch, runner.forward(batch), strict=True):
            tokens[work.slot].append(int(out[0].argmax()))
            logits[work.slot].append(out[0])
    return tokens, logits


# -- batching -----------------------------------------------------------------------------------


def test_batched_equals_single_exactly_on_embedded_model(embedded: LoadedModel) -> None:
    # With quantized weights llama.cpp computes each token row independently of the others in the
    # batch (per-row 8-bit activation quantization, integer dot products, per-sequence KV
    # streams), so batched logits are bit-identical to single-stream ones: assert exact equality.
    prompts = {0: prompt(5, 10), 1: prompt(17, 11), 2: prompt(30, 12), 3: prompt(9, 13)}
    steps = 10
    single = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=128))
    alone = {}
    for slot, p in prompts.items():
        single.release(0)
        tokens, logits = greedy(single, {0: p}, steps)
        alone[slot] = (tokens[0], logits[0])
    single.close()

    batched = LlamaCppRunner(embedded, cfg(slots=4, max_ctx=128))
    tokens, logits = greedy(batched, prompts, steps, join_at={0: 0, 1: 0, 2: 3, 3: 5})
    batched.close()
    for slot in prompts:
        assert tokens[slot] == alone[slot][0]
        for got, want in zip(logits[slot], alone[slot][1], strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batched_equals_single_on_tiny_models(tmp_path: Path, arch: str) -> None:
    config, _, model = tiny_setup(tmp_path, arch)
    prompts = {s: prompt(3 + 7 * s, 20 + s, vocab=config.vocab_size, low=3) for s in range(3)}
    runner = LlamaCppRunner(model, cfg(slots=3, max_ctx=64))
    alone = {}
    for slot, p in prompts.items():
        alone[slot] = greedy(runner, {slot: p}, 8)
        runner.release(slot)
    tokens, logits = greedy(runner, prompts, 8, join_at={0: 0, 1: 2, 2: 1})
    # F32 weights: llama.cpp's float matmul sums in a different order for a batch of several rows
    # than for one, unlike its quantized kernels (integer dot products, bit-exact above); the
    # ~1e-6 differences then round differently into the F16 KV cache. Measured: logits differ by
    # up to ~3e-3 on a scale of ~20. So: tokens exact, logits within 1e-3 of the logit range.
    for slot in prompts:
        assert tokens[slot] == alone[slot][0][slot]
        for got, want in zip(logits[slot], alone[slot][1][slot], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.ptp(want))
    runner.close()


def test_prefill_split_across_decode_calls(embedded: LoadedModel) -> None:
    # A batch larger than n_batch is decoded in several llama_decode calls; positions, sequence
    # ids and logits rows must line up across the split.
    tokens = prompt(40, seed=4)
    whole = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=64))
    want = whole.forward([SlotWork(0, tokens[:30], 0, "all"), SlotWork(1, tokens[:10], 0)])
    whole.close()
    split = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=64), n_batch=16)
    got = split.forward([SlotWork(0, tokens[:30], 0, "all"), SlotWork(1, tokens[:10], 0)])
    assert split.slot_length(0) == 30 and split.slot_length(1) == 10
    assert got[0].shape == (30, 49152) and got[1].shape == (1, 49152)
    # Different ubatch sizes may pick different matmul kernels: compare with a tolerance.
    np.testing.assert_allclose(got[0], want[0], atol=5e-2)
    np.testing.assert_allclose(got[1], want[1], atol=5e-2)
    assert (got[0].argmax(-1) == want[0].argmax(-1)).all()
    split.close()


def test_logits_last_and_all_shapes_and_agreement(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=64))
    tokens = prompt(12, seed=5)
    every, last = runner.forward([SlotWork(0, tokens, 0, "all"), SlotWork(1, tokens, 0, "last")])
    assert every.shape == (12, 49152) and last.shape == (1, 49152)
    np.testing.assert_array_equal(every[-1:], last)
    runner.close()


# -- rollback, release, lengths -----------------------------------------------------------------


def test_truncate_then_refeed_gives_identical_logits(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=128))
    tokens = prompt(20, seed=6)
    draft = prompt(6, seed=7)
    runner.forward([SlotWork(0, tokens, 0)])
    first = runner.forward([SlotWork(0, draft, 20, "all")])[0]
    assert runner.slot_length(0) == 26
    runner.truncate(0, 22)  # keep two draft tokens, as after a partial acceptance
    assert runner.slot_length(0) == 22
    again = runner.forward([SlotWork(0, draft[2:], 22, "all")])[0]
    np.testing.assert_array_equal(again, first[2:])
    runner.truncate(0, 20)  # and a different continuation from the same point
    other = runner.forward([SlotWork(0, prompt(6, seed=8), 20, "all")])[0]
    assert not np.array_equal(other, first)
    runner.close()


def test_release_forgets_a_slot_without_touching_others(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=64))
    a, b = prompt(8, seed=9), prompt(8, seed=10)
    first = runner.forward([SlotWork(0, a, 0), SlotWork(1, b, 0)])
    runner.release(0)
    assert runner.slot_length(0) == 0 and runner.slot_length(1) == 8
    again = runner.forward([SlotWork(0, a, 0)])
    np.testing.assert_array_equal(again[0], first[0])
    nxt = runner.forward([SlotWork(1, (5,), 8)])[0]  # slot 1 kept its 8 tokens
    fresh = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=64))
    fresh.forward([SlotWork(0, b, 0)])
    np.testing.assert_array_equal(nxt, fresh.forward([SlotWork(0, (5,), 8)])[0])
    fresh.close()
    runner.close()


def test_invariants_are_enforced(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=32))
    runner.forward([SlotWork(0, (10, 11, 12), 0)])
    with pytest.raises(ValueError, match="start_pos"):
        runner.forward([SlotWork(0, (13,), 2)])
    with pytest.raises(ValueError, match="twice"):
        runner.forward([SlotWork(1, (1,), 0), SlotWork(1, (2,), 0)])
    with pytest.raises(ValueError, match="out of range"):
        runner.forward([SlotWork(2, (1,), 0)])
    with pytest.raises(ValueError, match="vocab"):
        runner.forward([SlotWork(1, (49152,), 0)])
    with pytest.raises(ValueError):
        runner.truncate(0, 4)
    assert runner.slot_length(0) == 3 and runner.slot_length(1) == 0
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.forward([SlotWork(0, (1,), 3)])
    runner.close()  # idempotent


def test_context_overflow_raises_before_compute(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=2, max_ctx=16))
    runner.forward([SlotWork(0, prompt(10, 1), 0)])
    with pytest.raises(ContextOverflowError):
        runner.forward([SlotWork(0, prompt(7, 2), 10), SlotWork(1, (5,), 0)])
    assert runner.slot_length(0) == 10 and runner.slot_length(1) == 0  # nothing ran
    runner.forward([SlotWork(0, prompt(6, 2), 10)])  # exactly max_ctx is fine
    assert runner.slot_length(0) == 16
    runner.close()


def test_every_slot_gets_max_ctx_cells(tmp_path: Path) -> None:
    # Non-unified KV: each sequence owns its cells, so all slots can be full at once. The cache's
    # layout is the runner's, whatever the model: a tiny one fills 300 cells for a sliver of the
    # 135M model's prefill.
    config, _, model = tiny_setup(tmp_path)
    runner = LlamaCppRunner(model, cfg(slots=3, max_ctx=100))
    assert runner.cells_per_slot >= 100
    full = [SlotWork(s, prompt(100, 30 + s, vocab=config.vocab_size, low=3), 0) for s in range(3)]
    runner.forward(full)
    assert [runner.slot_length(s) for s in range(3)] == [100, 100, 100]
    runner.close()


# -- errors, memory, protocol -------------------------------------------------------------------


def test_malformed_gguf_raises_model_file_error(tmp_path: Path, embedded: LoadedModel) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"definitely not a gguf file" * 100)
    with pytest.raises(ModelFileError, match="magic"):
        LlamaCppRunner(file_model(garbage, "Q4_1"), cfg())

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(Path(embedded.path).read_bytes()[:5_000_000])
    with pytest.raises(ModelFileError, match="truncated.gguf"):
        LlamaCppRunner(file_model(truncated, "Q4_1"), cfg())

    with pytest.raises(ModelFileError, match="not found"):
        LlamaCppRunner(file_model(tmp_path / "missing.gguf", "Q4_1"), cfg())


def test_missing_tensor_raises_model_file_error(tmp_path: Path) -> None:
    # A well-formed GGUF whose tensors do not make a model (a layer's FFN is missing).
    import gguf

    config = tiny_config("llama")
    weights = tiny_weights(config)
    path = tmp_path / "broken.gguf"
    from tests.gguf_writer import gguf_tensors

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(config.n_layers)
    w.add_context_length(64)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.ffn_size)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(config.vocab_size)
    w.add_tokenizer_model("none")
    for name, arr in gguf_tensors(config, weights).items():
        if name != "blk.1.ffn_up.weight":
            w.add_tensor(name, arr)
    finish_gguf(w)
    with pytest.raises(ModelFileError, match="ffn_up"):
        LlamaCppRunner(file_model(path, "F32"), cfg())


def test_wrong_format_or_quant_is_a_clear_error(embedded: LoadedModel, tmp_path: Path) -> None:
    st = file_model(tmp_path, "BF16", format="safetensors")
    with pytest.raises(UnsupportedModelError, match="GGUF"):
        LlamaCppRunner(st, cfg())
    with pytest.raises(UnsupportedModelError, match="localinfer quantize"):
        LlamaCppRunner(embedded, cfg(quant="q8_0"))
    with pytest.raises(UnsupportedModelError, match="localinfer quantize"):
        LlamaCppRunner(embedded, cfg(quant="int8"))
    for same in ("Q4_1", "q4_1", "int4", "none"):  # what the file already is: accepted
        LlamaCppRunner(embedded, cfg(slots=1, max_ctx=16, quant=same)).close()


def test_quant_matches() -> None:
    from localinfer.backends.llamacpp.quantize import quant_matches

    assert quant_matches("q4_k_m", "Q4_K") and quant_matches("Q4_K_M", "Q4_K_M")
    assert quant_matches("int8", "Q8_0") and quant_matches("int4", "Q4_0")
    assert not quant_matches("q4_0", "Q4_1") and not quant_matches("int4", "Q8_0")


def test_memory_report_uses_llama_cpp_figures(embedded: LoadedModel) -> None:
    runner = LlamaCppRunner(embedded, cfg(slots=4, max_ctx=512))
    report = runner.memory()
    # Weights: every tensor of the 98 MB file except its header and metadata.
    size = Path(embedded.path).stat().st_size
    assert 0.95 * size < report.weights <= size
    # KV: the buffer llama.cpp logged equals the shape arithmetic: 4 slots x 512 cells x
    # 30 layers x 3 kv heads x (64 + 64) dims x 2 bytes (F16) = 47,185,920 bytes.
    assert report.kv_cache == runner.kv_cache_bytes_computed() == 2048 * 30 * 3 * 128 * 2
    assert (
        report.overhead > 0 and report.total == report.weights + report.kv_cache + report.overhead
    )
    runner.close()


def test_llama_cpp_log_is_silent_by_default(
    embedded: LoadedModel, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCALINFER_DEBUG", raising=False)
    runner = LlamaCppRunner(embedded, cfg(slots=1, max_ctx=64))
    runner.forward([SlotWork(0, (1, 2, 3), 0)])
    runner.close()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_runner_protocol_and_factory(embedded: LoadedModel) -> None:
    runner = create_runner(embedded, RunnerConfig(slots=2, max_ctx=64, threads=1))
    assert isinstance(runner, Runner)
    assert runner.threads == 1
    info = runner.info
    assert (info.backend, info.slots, info.max_ctx, info.vocab_size, info.quant) == (
        "llamacpp",
        2,
        64,
        49152,
        "Q4_1",
    )
    runner.close()


def test_localinfer_debug_passes_llama_cpp_log_through(
    embedded: LoadedModel, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALINFER_DEBUG", "1")
    LlamaCppRunner(embedded, cfg(slots=1, max_ctx=64)).close()
    assert "KV buffer size" in capfd.readouterr().err


def test_default_threads_are_physical_cores(embedded: LoadedModel) -> None:
    import os

    from localinfer.backends.llamacpp.cpu import physical_cores

    cores = physical_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    runner = LlamaCppRunner(embedded, RunnerConfig(slots=1, max_ctx=32))
    assert runner.threads == cores
    runner.close()
