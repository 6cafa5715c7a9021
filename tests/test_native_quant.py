"""GGUF Q8_0 / Q4_0 / Q4_1 matrices kept as stored blocks by the torch runner's native CPU kernels
(backends/torch/block_weights.py): results bit for bit those of the float32 path on the
dequantized weights, batch invariance kept, memory the block bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.torch import cpu_kernels  # noqa: E402
from localinfer.backends.torch.block_weights import BlockMatrix  # noqa: E402
from localinfer.backends.torch.native_forward import CHUNK_TOKENS  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from localinfer.errors import ModelFileError  # noqa: E402
from localinfer.loading.gguf_config import config_from_gguf  # noqa: E402
from localinfer.loading.gguf_file import GGUFFile  # noqa: E402
from localinfer.loading.gguf_weights import GGUFWeights  # noqa: E402
from localinfer.loading.model import LoadedModel  # noqa: E402
from localinfer.loading.model_config import ModelConfig  # noqa: E402
from tests.gguf_writer import add_model_header, finish_gguf, gguf_tensors  # noqa: E402
from tests.tiny import tiny_config, tiny_weights  # noqa: E402

Q = GGMLQuantizationType
BIG = 100_000  # native_max_tokens for the float32 reference: every forward on the kernels


@pytest.fixture(scope="module")
def kernels() -> cpu_kernels.NativeKernels:
    return cpu_kernels.load_kernels() or pytest.skip(
        "native kernels cannot be built here (see the logged reason)"
    )


@pytest.fixture(autouse=True)
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


# -- the matrix product alone ------------------------------------------------------------------


def quantized(rows: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    return np.asarray(gguf_quants.quantize(rows, qtype))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
@pytest.mark.parametrize("tokens", [1, 3, 5, 8, 9, 20])
def test_block_product_equals_float_product_on_dequantized_rows(
    kernels: cpu_kernels.NativeKernels, qtype: GGMLQuantizationType, tokens: int
) -> None:
    rng = np.random.default_rng(tokens)
    w = rng.normal(0, 1, size=(37, 96)).astype(np.float32)  # odd rows: a pair and a single
    w[3] += 5.0  # a row far from 0: Q4_1's offset m matters
    blocks = quantized(w, qtype)
    dense = torch.from_numpy(np.asarray(gguf_quants.dequantize(blocks, qtype)))
    m = BlockMatrix(qtype.name, torch.from_numpy(blocks.copy()), 96)
    x = torch.from_numpy(rng.normal(size=(tokens, 96)).astype(np.float32))
    bias = torch.from_numpy(rng.normal(size=37).astype(np.float32))
    got = kernels.linear(x, m, bias, 2)
    assert torch.equal(got, kernels.linear(x, dense.contiguous(), bias, 2))
    for t in range(tokens):  # each token's row as if alone
        assert torch.equal(kernels.linear(x[t : t + 1].contiguous(), m, bias, 1)[0], got[t])
    rows = torch.tensor([36, 0, 3, 3], dtype=torch.long)
    assert torch.equal(kernels.dequant_rows(m, rows), dense[rows])


# -- tiny models written as GGUF ---------------------------------------------------------------


def write_quantized_gguf(
    path: Path, config: ModelConfig, types: dict[str, GGMLQuantizationType], seed: int = 0
) -> Path:
    """tiny_weights(config) as a GGUF whose tensors named by a key of ``types`` (a GGUF name's
    suffix, e.g. "attn_q.weight", or "token_embd.weight") are stored in that type; other
    matrices F32, norms F32."""
    w = GGUFWriter(str(path), arch=config.arch)
    add_model_header(w, config)
    w.add_file_type(LlamaFileType.MOSTLY_Q4_1)
    w.add_tokenizer_model("none")
    for name, arr in gguf_tensors(config, tiny_weights(config, seed)).items():
        qtype = next((t for suffix, t in types.items() if name.endswith(suffix)), None)
        if qtype is None or arr.ndim != 2:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, quantized(arr, qtype), raw_dtype=qtype)
    finish_gguf(w)
    return path


def gguf_model(path: Path) -> LoadedModel:
    gguf = GGUFFile(path)
    config = config_from_gguf(gguf)
    return LoadedModel(
        name=path.stem,
        path=path,
        format="gguf",
        config=config,
        tokenizer=None,  # type: ignore[arg-type]
        chat_template=None,
        weights=GGUFWeights(gguf, config),
        file_quant=gguf.file_type(),
    )


ALL_Q4_1 = {".weight": Q.Q4_1, "token_embd.weight": Q.Q8_0}
MIXED = {
    "attn_q.weight": Q.Q4_0,
    "attn_k.weight": Q.Q4_0,
    "attn_v.weight": Q.Q4_0,
    "attn_output.weight": Q.Q8_0,
    "ffn_gate.weight": Q.Q4_1,
    "ffn_up.weight": Q.Q8_0,  # gate|up in two types: that matrix stays float32
    "ffn_down.weight": Q.Q4_0,
    "output.weight": Q.Q4_0,
    "token_embd.weight": Q.Q4_1,
}
CASES = [("llama", ALL_Q4_1), ("llama", MIXED), ("qwen2", ALL_Q4_1), ("qwen2", MIXED)]


def tiny_runners(
    tmp_path: Path, arch: str, types: dict[str, GGMLQuantizationType], slots: int = 3
) -> tuple[TorchRunner, TorchRunner, LoadedModel]:
    config = tiny_config(arch, tied_embeddings=arch == "llama")
    model = gguf_model(write_quantized_gguf(tmp_path / f"tiny-{arch}.gguf", config, types))
    cfg = RunnerConfig(slots=slots, max_ctx=96, dtype="float32")
    # Every forward on the kernels, as the float32 reference: bit for bit.
    blocks = TorchRunner(model, cfg, native_max_tokens=BIG, stored_blocks=True)
    dense = TorchRunner(model, cfg, native_max_tokens=BIG, stored_blocks=False)
    return blocks, dense, model


def seq(n: int, seed: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(0, 256, size=n))


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize(("arch", "types"), CASES)
def test_tiny_block_model_equals_dequantized_model(
    tmp_path: Path, arch: str, types: dict[str, GGMLQuantizationType]
) -> None:
    blocks, dense, _ = tiny_runners(tmp_path, arch, types)
    kept = blocks._model.weights
    assert kept.has_blocks() and not dense._model.weights.has_blocks()
    gate_up = kept.layers[0].gate_up
    assert isinstance(gate_up, BlockMatrix) == (types is ALL_Q4_1)
    assert isinstance(kept.embed, BlockMatrix)
    assert (kept.lm_head is kept.embed) == (arch == "llama")
    prompts = {0: seq(40, 1), 1: seq(3, 2), 2: seq(17, 3)}
    for runner in (blocks, dense):
        runner.forward([SlotWork(s, p, 0, logits="all") for s, p in prompts.items()])
    # A ragged batch (prefill chunks beside decode steps), all logits, then each slot alone.
    step = {0: seq(9, 4), 1: seq(1, 5), 2: seq(2, 6)}
    work = [SlotWork(s, t, len(prompts[s]), logits="all") for s, t in step.items()]
    got = blocks.forward(work)
    want = dense.forward(work)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    for s in step:
        blocks.truncate(s, len(prompts[s]))
    for w_item, batched in zip(work, got, strict=True):
        (alone,) = blocks.forward([w_item])
        np.testing.assert_array_equal(alone, batched)


@pytest.mark.usefixtures("kernels")
def test_memory_is_the_block_bytes_and_kernels_off_converts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the kernels the blocks are not kept: the file is held converted, as on CUDA
    (int4 groups of 32 from the stored codes, torch's packed kernel), not as float32."""
    blocks, dense, model = tiny_runners(tmp_path, "llama", ALL_Q4_1, slots=1)
    assert blocks.info.quant == "Q4_1" and dense.info.quant == "fp32"
    stored = model.weights.gguf.tensor_nbytes()  # every tensor as stored: blocks + F32 norms
    assert blocks.memory().weights == stored
    assert dense.memory().weights == dense._model.weights.nbytes() > 5 * stored
    # Asking for float weights by name keeps the float32 path (the quality reference does).
    assert TorchRunner(model, RunnerConfig(slots=1, max_ctx=32, quant="none")).info.quant == "fp32"
    monkeypatch.setenv("LOCALINFER_NATIVE_KERNELS", "0")
    off = TorchRunner(model, RunnerConfig(slots=1, max_ctx=32, dtype="float32"))
    assert off.info.quant == "Q4_1" and off.native_max_tokens == 0
    assert not off._model.weights.has_blocks() and "int4pack" in off.quant_kernels
    (logits,) = off.forward([SlotWork(0, seq(5, 0), 0)])
    (want,) = dense.forward([SlotWork(0, seq(5, 0), 0)])
    # The same weights (scale and zero rounded once to bf16), bf16 activations in the products:
    # measured 0.52% of the logits' norm.
    assert np.linalg.norm(logits - want) / np.linalg.norm(want) < 2e-2


class WrongRowBytes:
    """A GGUF source whose k_proj rows come back a byte short (a corrupt block tensor)."""

    def __init__(self, inner: GGUFWeights) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def stored_rows(self, name: str):
        qtype, rows = self._inner.stored_rows(name)
        return (qtype, rows[:, :-1]) if "k_proj" in name else (qtype, rows)


@pytest.mark.usefixtures("kernels")
def test_block_tensor_of_the_wrong_size_is_a_model_file_error(tmp_path: Path) -> None:
    model = gguf_model(write_quantized_gguf(tmp_path / "tiny.gguf", tiny_config("llama"), ALL_Q4_1))
    model.weights = WrongRowBytes(model.weights)  # type: ignore[assignment]
    with pytest.raises(ModelFileError, match="k_proj.*bytes"):  # blocks kept, whatever the plan
        TorchRunner(model, RunnerConfig(slots=1, max_ctx=32), stored_blocks=True)


# -- the embedded model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    return load_model(embedded_model_path())


@pytest.mark.usefixtures("kernels")
def test_embedded_model_on_blocks_equals_float32(embedded: LoadedModel) -> None:
    cfg = RunnerConfig(slots=3, max_ctx=400, dtype="float32")
    blocks = TorchRunner(embedded, cfg, native_max_tokens=BIG, stored_blocks=True)
    dense = TorchRunner(embedded, cfg, native_max_tokens=BIG, stored_blocks=False)
    assert blocks.info.quant == "Q4_1"
    weights = blocks._model.weights
    assert isinstance(weights.layers[0].qkv, BlockMatrix) and weights.layers[0].qkv.qtype == "Q4_1"
    assert weights.lm_head is weights.embed and weights.embed.qtype == "Q8_0"
    assert blocks.memory().weights == 96_576_768  # the file's tensor bytes
    assert dense.memory().weights == 134_515_008 * 4
    from tests.test_torch_native import HUGE_PAGES_SEEN, _vma_flags

    if HUGE_PAGES_SEEN:  # blocks on huge pages, as dense fp32 matrices are
        for m in (weights.embed, weights.layers[0].qkv, weights.layers[29].down):
            assert "hg" in _vma_flags(m.blocks.data_ptr())
            assert m.blocks.untyped_storage().nbytes() == m.blocks.nbytes  # own storage

    # The block runner's long forwards run in native chunks (CHUNK_TOKENS, 256 in use): 16 here,
    # so a 40-token prompt takes three chunks (one ragged) at an eighth of a 300-token prefill's
    # cost, while the dense runner's one-shot forward is the reference: chunked equals one-shot.
    assert blocks._native.chunk_tokens == CHUNK_TOKENS  # the attribute the forward reads
    blocks._native.chunk_tokens = 16  # the ragged batch below (24 tokens) is chunked too
    prompt = seq(40, 7)
    (got,) = blocks.forward([SlotWork(0, prompt, 0, logits="all")])
    (want,) = dense.forward([SlotWork(0, prompt, 0, logits="all")])
    np.testing.assert_array_equal(got, want)

    def greedy(runner: TorchRunner, first: np.ndarray, steps: int) -> list[np.ndarray]:
        trail = [first]
        for i in range(steps):
            token = int(np.argmax(trail[-1]))
            trail += runner.forward([SlotWork(0, (token,), len(prompt) + i)])
        return trail

    # Decode steps, logits equal at every one (three: each reads all 538 MB of dense weights).
    steps = 3
    decoded = greedy(blocks, got[-1], steps)
    for g, w in zip(decoded, greedy(dense, want[-1], steps), strict=True):
        np.testing.assert_array_equal(g, w)
    tokens = [int(np.argmax(x)) for x in decoded]
    ragged = [
        SlotWork(0, (tokens[-1], 5, 6), len(prompt) + steps, logits="all"),
        SlotWork(1, seq(20, 8), 0, logits="all"),
        SlotWork(2, (42,), 0),
    ]
    for g, w in zip(blocks.forward(ragged), dense.forward(ragged), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize(("arch", "types"), CASES)
def test_long_forwards_on_blocks_run_torch_ops_on_dequantized_matrices(
    tmp_path: Path, arch: str, types: dict[str, GGMLQuantizationType]
) -> None:
    """Above its native limit a block runner multiplies with torch ops by each block matrix
    dequantized as it is used: the same model to float32 rounding, the KV it writes serves the
    native steps that follow, and a block LM head still goes through the kernels."""
    config = tiny_config(arch, tied_embeddings=arch == "llama")
    model = gguf_model(write_quantized_gguf(tmp_path / f"tiny-{arch}.gguf", config, types))
    cfg = RunnerConfig(slots=2, max_ctx=96, dtype="float32")
    hybrid = TorchRunner(model, cfg, native_max_tokens=4, stored_blocks=True)
    native = TorchRunner(model, cfg, native_max_tokens=BIG, stored_blocks=True)
    assert hybrid._model.weights.has_blocks() and hybrid.native_max_tokens == 4
    # F.linear on each freshly dequantized matrix, not oneDNN's plain path (slower there: the
    # BlockForm comment has the figures).
    assert not hybrid._model.weights.onednn_dense
    prompt = seq(40, 11)
    work = [SlotWork(0, prompt, 0, logits="all"), SlotWork(1, seq(7, 12), 0, logits="all")]
    for got, want in zip(hybrid.forward(work), native.forward(work), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.95
    steps = [SlotWork(0, (5,), len(prompt)), SlotWork(1, (6, 7), 7, logits="all")]  # native
    for got, want in zip(hybrid.forward(steps), native.forward(steps), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
