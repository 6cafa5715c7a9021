"""The llama.cpp budget for big vocabularies, part by part (issue #43): the KV cache as llama.cpp
lays it out (every cell on Gemma 3's sliding layers, cells padded to 256), the logits rows the
runner reserves (one per slot and 32 for speculation, not a whole 512-token chunk: 1 MiB a row
at 262,144 tokens) held on a GPU but only written on the CPU, and the tokenizer tables that grow
with the vocabulary. Checked against the real runner on a random Gemma-3-shaped model with a
262,144-token vocabulary written here, and on Gemma 3 270M where its package is installed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from bench.child import child_env, module_argv
from localinfer.backend_budget import compute_budget
from localinfer.backends.llamacpp.batch import decode_spans
from localinfer.backends.llamacpp.buffers import parse_buffers
from localinfer.backends.llamacpp.compute_model import activation_floats
from localinfer.backends.llamacpp.context_shape import cells_per_sequence, output_rows
from localinfer.backends.llamacpp.profile import PROFILE
from localinfer.budget import BudgetRequest, kv_cache_bytes
from localinfer.budget.measured import GrowthProbe
from localinfer.budget.planner import compute_buffer_bytes
from localinfer.budget.report import BudgetReport
from localinfer.budget_verify import _return_free_heap
from localinfer.facts.arch import ArchSpec
from localinfer.facts.kv_dtype import KV_DTYPES
from tests.gguf_writer import finish_gguf
from tests.model_files import CHATML, gemma3_gguf, tiny_vocab

F16 = KV_DTYPES["f16"]
MiB = 2**20
VOCAB = 262144
CTX = 2048
ROW = VOCAB * 4  # one float32 logits row
# Gemma 3 270M's shape (its GGUF header): 18 layers, every sixth global, a 512-token window.
GEMMA3_270M = ArchSpec(
    arch="gemma3", n_layers=18, hidden_size=640, n_heads=4, n_kv_heads=1, head_dim=256,
    ffn_size=2048, vocab_size=VOCAB, max_ctx=32768, tied_embeddings=True, qk_norm=True,
    sliding_window=512, sliding_pattern=6,
)  # fmt: skip
# The random model: Gemma 3's kind and vocabulary at a small width (the tables, the LM head and
# its logits rows are the vocabulary's; the layers stay cheap).
LAYERS, HIDDEN, FFN, HEADS, HEAD_DIM, WINDOW = 6, 256, 512, 4, 64, 128


# -- the rules, without llama.cpp --------------------------------------------------------------


def test_cells_and_output_rows_as_llama_cpp_sizes_them() -> None:
    # n_ctx and n_ctx / n_seq_max both rounded up to 256 (llama-context.cpp).
    assert cells_per_sequence(2048, 1) == 2048
    assert cells_per_sequence(2000, 1) == 2048
    assert cells_per_sequence(1000, 3) == 1024
    assert cells_per_sequence(100, 3) == 256
    # n_outputs_max: a row per slot and 32 for speculative verification, at most n_batch.
    assert output_rows(1, 512) == 33
    assert output_rows(8, 512) == 40
    assert output_rows(600, 512) == 512


def test_decode_calls_carry_at_most_the_reserved_rows() -> None:
    rng = np.random.default_rng(0)
    for n_batch, max_outputs in ((512, 33), (16, 33), (64, 5), (7, 1)):
        want = (rng.random(300) < 0.4).astype(np.int8)
        want[:40] = 1  # a verification or an "all" request: outputs in a row
        spans = decode_spans(want, n_batch, max_outputs)
        assert spans[0][0] == 0 and spans[-1][1] == len(want)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        for start, end in spans:
            assert 0 < end - start <= n_batch
            assert want[start:end].sum() <= max_outputs
        # Each call is as long as both limits allow: the next row would break one of them.
        for start, end in spans[:-1]:
            assert end - start == n_batch or want[start : end + 1].sum() > max_outputs
    assert decode_spans(np.zeros(0, np.int8), 512, 33) == []
    # A batch within both limits is one call (a decode step), however many rows it flags.
    assert decode_spans(np.ones(8, np.int8), 512, 33) == [(0, 8)]
    assert decode_spans(np.ones(8, np.int8), 512, 5) == [(0, 5), (5, 8)]
    assert decode_spans(np.zeros(8, np.int8), 3, 33) == [(0, 3), (3, 6), (6, 8)]


def test_both_caches_of_a_sliding_window_model_count() -> None:
    log = (
        "llama_context:        CPU  output buffer size =     1.00 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =     6.00 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =    30.00 MiB\n"
        "sched_reserve:        CPU compute buffer size =   514.50 MiB\n"
        "sched_reserve:        CPU compute buffer size =    53.77 MiB\n"
    )
    buffers = parse_buffers(log)
    assert buffers.kv == 36 * MiB  # the full-attention layers' cache and the sliding layers'
    assert buffers.output == 1 * MiB
    assert round(buffers.compute / MiB, 2) == 53.77  # reserved again: the later one


def test_llama_cpp_kv_keeps_every_cell_on_sliding_layers() -> None:
    per_layer_cell = 2 * 256 * 2  # K + V, one KV head of 256, f16
    # llama.cpp's swa_full cache: 18 layers x 2,048 cells (36 MiB), not 3 x 2,048 + 15 x 512.
    assert kv_cache_bytes(GEMMA3_270M, CTX, 1, F16, PROFILE) == 18 * 2048 * per_layer_cell
    assert kv_cache_bytes(GEMMA3_270M, CTX, 1, F16) == (3 * 2048 + 15 * 512) * per_layer_cell
    # Three slots of 1,000 tokens hold 1,024 cells each.
    assert kv_cache_bytes(GEMMA3_270M, 1000, 3, F16, PROFILE) == 3 * 18 * 1024 * per_layer_cell


def test_reserved_logits_rows_count_on_a_gpu_written_ones_on_the_cpu() -> None:
    layer = 512 * activation_floats(GEMMA3_270M) * 4
    masks = 2 * 2048 * 512 * 2  # full-attention and sliding masks, f16 (flash attention)
    assert layer + masks < 33 * ROW  # at this vocabulary the reserved rows make the peak
    cuda = compute_buffer_bytes(GEMMA3_270M, CTX, 1, 512, PROFILE, "cuda")
    # n_outputs_max rows, not a 512-row chunk (512 MiB), above a chunk-wide query (1,024 wide).
    head = 33 * ROW + 512 * 1024 * 4
    assert cuda == head
    planned = compute_buffer_bytes(GEMMA3_270M, CTX, 1, 512, PROFILE, "planned")
    assert planned == head + ROW  # and the host output buffer, when the device is unknown
    if PROFILE.fused_attention("cpu", GEMMA3_270M, CTX, 512):
        cpu = compute_buffer_bytes(GEMMA3_270M, CTX, 1, 512, PROFILE, "cpu")
        assert cpu == layer + masks + ROW  # the layer's peak and the output buffer's row


def test_tokenizer_tables_grow_the_host_runtime_with_the_vocabulary() -> None:
    small, big = PROFILE.runtime("cpu", 49152), PROFILE.runtime("cpu", VOCAB)
    assert 100 * MiB < big - small < 200 * MiB
    assert PROFILE.runtime("cuda", VOCAB) == PROFILE.runtime("cuda", 49152)


# -- against the runner ------------------------------------------------------------------------


def write_big_vocab_gguf(path: Path, seed: int = 0) -> Path:
    """A random Gemma-3-shaped F16 GGUF with a 262,144-token vocabulary (the tests' byte-level
    BPE padded with unused tokens), tied embeddings, every sixth layer global. F16, which
    llama.cpp's CPU backend holds as stored: block types such as Q4_0 or Q4_K get a second,
    repacked copy on CPUs with the kernels for it, which this test is not about."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="gemma3")
    w.add_file_type(1)  # MOSTLY_F16
    w.add_block_count(LAYERS)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(1)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(WINDOW)
    tokens, types, merges = tiny_vocab()
    pad = VOCAB - len(tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens + [f"<unused_{i}>" for i in range(pad)])
    w.add_token_types(types + [4] * pad)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    q, kv = HEADS * HEAD_DIM, HEAD_DIM
    norms = {"attn_norm": HIDDEN, "ffn_norm": HIDDEN, "attn_q_norm": HEAD_DIM}
    norms |= {"attn_k_norm": HEAD_DIM, "post_attention_norm": HIDDEN, "post_ffw_norm": HIDDEN}
    matrices = {"attn_q": (q, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN)}
    matrices |= {"attn_output": (HIDDEN, q), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN)}
    matrices |= {"ffn_down": (HIDDEN, FFN)}
    w.add_tensor("token_embd.weight", _small_f16(VOCAB, HIDDEN, rng))
    for i in range(LAYERS):
        for name, width in norms.items():
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(width, dtype=np.float32))
        for name, (rows, cols) in matrices.items():
            w.add_tensor(f"blk.{i}.{name}.weight", _small_f16(rows, cols, rng))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    finish_gguf(w)
    return path


def _small_f16(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random f16 weights of either sign below 0.0005, drawn as their bit patterns."""
    bits = rng.integers(0x0C00, 0x1000, (rows, cols), dtype=np.uint16)
    bits |= rng.integers(0, 2, (rows, cols), dtype=np.uint16) << 15
    return bits.view(np.float16)


@pytest.fixture(scope="module")
def big_vocab_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_big_vocab_gguf(tmp_path_factory.mktemp("vocab") / "gemma3-262k-random.gguf")


@pytest.fixture(scope="module")
def gemma3_270m(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield gemma3_gguf(tmp_path_factory.mktemp("gemma3"))


def budget(path: Path, device: str) -> BudgetReport:
    return compute_budget(BudgetRequest(str(path), ctx=CTX, device=device, backend="llamacpp"))


def check_parts(path: Path, layers: int, kv_row: int) -> None:
    """Weights and KV equal to what the runner holds; llama.cpp's reserved compute buffer within
    the budget's GPU figure (conservative by at most 15%, as tests/test_budget_measured.py asks
    of llama.cpp's own report); what the CPU writes of it, after the budget's own measurement
    (one 512-token chunk at the end of the context), within the CPU figure."""
    pytest.importorskip("llama_cpp")
    from localinfer.backends.base import SlotWork
    from localinfer.backends.llamacpp.runner import LlamaCppRunner
    from localinfer.loading.loader import load_model
    from tests.llamacpp_helpers import cfg

    cpu, planned = budget(path, "cpu"), budget(path, "8GiB")
    arch = header_arch(path)
    assert PROFILE.fused_attention("cpu", arch, CTX, 512)  # the suite pins it on
    model = load_model(path)
    probe = GrowthProbe("llamacpp")
    runner = LlamaCppRunner(model, cfg(max_ctx=CTX, slots=1))
    load = probe.finish()
    try:
        held = runner.memory()
        assert held.weights == cpu.weights_bytes
        # Every layer keeps all 2,048 cells, sliding or not: llama.cpp's swa_full cache.
        assert held.kv_cache == cpu.kv_cache_bytes == layers * CTX * kv_row
        assert cpu.kv_cache_bytes > kv_cache_bytes(arch, CTX, 1, F16)  # the windowed rule's
        reserved = held.overhead  # compute + output buffers, nothing written yet
        assert reserved < 40 * ROW  # 33 logits rows reserved, not 512 (512 MiB)
        assert 0.98 * reserved <= planned.compute_bytes <= 1.15 * reserved
        runner.fill_synthetic(0, CTX - 512)
        tokens = tuple(1 + i % (VOCAB - 1) for i in range(512))
        runner.forward([SlotWork(0, tokens, CTX - 512, "last")])
        _return_free_heap()  # the fill's host copies, as `budget --verify` drops them
        # What the runs wrote in the memory the runner mapped but had not written (the compute
        # buffer; llama.cpp clears its KV and output buffers when it makes them).
        written = None if load is None else load.growth_now() - load.growth
    finally:
        runner.close()
    if written is None or not load.unwritten:
        pytest.skip("the kernel does not say which pages are resident")
    # On the CPU the budget counts the graph's written part and the output buffer's row.
    predicted_graph = cpu.compute_bytes - ROW
    assert 0.97 * written <= predicted_graph <= 1.15 * written
    assert written + 10 * ROW < reserved  # of the 33 reserved logits rows, one is written


def header_arch(path: Path) -> ArchSpec:
    from localinfer.budget.file_headers import read_gguf_header

    arch = read_gguf_header(path).arch
    assert arch is not None
    return arch


def check_total(path: Path) -> None:
    """The predicted total against the RSS growth of a fresh process (scripts/budget-accuracy's
    cell: the budget, then `--verify`'s measurement), within its 10%."""
    cmd = module_argv("bench.budget_accuracy", "--model", str(path), "--cell", "llamacpp")
    done = subprocess.run(
        [*cmd, str(CTX), "1"], capture_output=True, text=True, timeout=600, env=child_env()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check = json.loads(done.stdout.strip().splitlines()[-1])["check"]
    assert check["predicted_kv_cache"] == check["measured_kv_cache"]
    assert check["total_error"] is not None and abs(check["total_error"]) <= 0.10, check


@pytest.mark.llamacpp
def test_random_big_vocab_model_part_by_part(big_vocab_gguf: Path) -> None:
    check_parts(big_vocab_gguf, LAYERS, 2 * HEAD_DIM * 2)


@pytest.mark.slow  # a fresh process loading a 262k-token tokenizer: ~5 s
@pytest.mark.llamacpp
def test_random_big_vocab_model_total(big_vocab_gguf: Path) -> None:
    pytest.importorskip("llama_cpp")
    check_total(big_vocab_gguf)


@pytest.mark.slow  # assembles the 253 MB file
@pytest.mark.llamacpp
def test_gemma3_270m_part_by_part(gemma3_270m: Path) -> None:
    check_parts(gemma3_270m, 18, 2 * 256 * 2)


@pytest.mark.slow
@pytest.mark.llamacpp
def test_gemma3_270m_total(gemma3_270m: Path) -> None:
    pytest.importorskip("llama_cpp")
    check_total(gemma3_270m)
