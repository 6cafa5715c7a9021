"""Decode attention without a mask (backends/torch/attention.py): the mask-free runs against the
masked call they replace, on batches mixing lengths, idle slots, grouped-query heads and sliding
windows; and the torch runner's decode logits with them against the numpy reference.

Runs on the CPU; the ``gpu`` cases run the same comparison on CUDA in bf16, where the mask-free
call is the one SDPA can give its flash kernel (scripts/gpu-check)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.ragged_batch import pack_batch  # noqa: E402
from localinfer.backends.torch import attention  # noqa: E402
from localinfer.backends.torch.attention import build_groups, grouped_attention  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from tests.reference_numpy import reference_logits  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEVICES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param(
        "cuda",
        torch.bfloat16,
        id="cuda-bf16",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]

SLOTS, MAX_CTX, HEAD_DIM = 8, 64, 16
# slot -> tokens already cached; each decodes one more at that position.
BATCHES = {
    "one-stream": {3: 20},
    "same-length-contiguous": {1: 17, 2: 17, 3: 17},
    "same-length-gap": {0: 9, 2: 9, 5: 9},  # idle slots between members: separate runs
    "mixed-lengths": {0: 5, 1: 40, 2: 40, 4: 1, 5: 63, 7: 12},
    "position-zero": {0: 0, 1: 0},
}


def _decode(lengths: dict[int, int]) -> list[SlotWork]:
    return [SlotWork(slot, (7,), start) for slot, start in lengths.items()]


def _both(
    batch: list[SlotWork], q_per_kv: int, window: int | None, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(mask-free, masked) attention of a decode batch on random queries and cache, every layer
    kind: returns both outputs stacked over [full layer, sliding layer] and the mask-free groups."""
    gen = torch.Generator().manual_seed(len(batch) * 31 + q_per_kv)
    packed = pack_batch(batch)
    kv_heads = 2
    q = torch.randn(len(packed.tokens), kv_heads * q_per_kv, HEAD_DIM, generator=gen)
    keys = torch.randn(SLOTS, kv_heads, MAX_CTX, HEAD_DIM, generator=gen)
    values = torch.randn(SLOTS, kv_heads, MAX_CTX, HEAD_DIM, generator=gen)
    q, keys, values = (t.to(device=device, dtype=dtype) for t in (q, keys, values))
    dev = torch.device(device)
    free = build_groups(packed, q_per_kv, window, dev)
    masked = build_groups(packed, q_per_kv, window, dev, mask_free=False)
    outs = []
    for groups in (free, masked):
        layers = [grouped_attention(q, keys, values, groups, sliding) for sliding in (False, True)]
        outs.append(torch.stack(layers))
    return outs[0], outs[1], free


@pytest.mark.parametrize(("device", "dtype"), DEVICES)
@pytest.mark.parametrize("window", [None, 8, 30])
@pytest.mark.parametrize("q_per_kv", [1, 3])
@pytest.mark.parametrize("case", list(BATCHES))
def test_mask_free_runs_equal_the_masked_call(
    case: str, q_per_kv: int, window: int | None, device: str, dtype: torch.dtype
) -> None:
    batch = _decode(BATCHES[case])
    free, masked, groups = _both(batch, q_per_kv, window, device, dtype)
    assert all(g.runs is not None and g.mask_full is None for g in groups)  # no mask built
    tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(free, masked, **tol)


def test_runs_cut_at_gaps_and_length_changes() -> None:
    packed = pack_batch(_decode(BATCHES["mixed-lengths"]))
    (group,) = build_groups(packed, 2, 8, torch.device("cpu"))
    runs = [(r.lo, r.hi, r.kv_len, r.window_start) for r in group.runs]
    assert runs == [(0, 1, 6, 0), (1, 3, 41, 33), (4, 5, 2, 0), (5, 6, 64, 56), (7, 8, 13, 5)]
    assert [(r.token_start, r.token_end) for r in group.runs] == [
        (0, 1),
        (1, 3),
        (3, 4),
        (4, 5),
        (5, 6),
    ]


def test_too_many_runs_or_longer_items_keep_the_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_DECODE_RUNS launches, and for any item of more than one token, the group keeps
    its one masked call; both still equal the mask-free reference where there is one."""
    monkeypatch.setattr(attention, "MAX_DECODE_RUNS", 2)
    batch = _decode(BATCHES["mixed-lengths"])
    free, masked, groups = _both(batch, 2, 8, "cpu", torch.float32)
    assert groups[0].runs is None and groups[0].mask_full is not None
    torch.testing.assert_close(free, masked)
    verify = [SlotWork(0, (1, 2, 3), 10), SlotWork(1, (4,), 20)]
    (group,) = build_groups(pack_batch(verify), 2, None, torch.device("cpu"))
    assert group.runs is None


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3"])
def test_runner_decode_logits_match_the_reference_through_the_runs(arch: str) -> None:
    """torch ops on every forward (no native kernels): slots at different lengths decode
    together, some at equal lengths side by side, the mistral case past its window."""
    overrides = {"sliding_window": 8} if arch == "mistral" else {}
    model = tiny_model(arch, **overrides)
    config = RunnerConfig(slots=4, max_ctx=64, dtype="float32")
    runner = TorchRunner(model, config, native_max_tokens=0)
    histories = {0: random_tokens(12, seed=1), 1: random_tokens(12, seed=2), 3: random_tokens(20)}
    for slot, tokens in histories.items():
        runner.forward([SlotWork(slot, tuple(tokens), 0)])
    for step in range(3):
        batch = [SlotWork(s, (9 + step + s,), len(t)) for s, t in histories.items()]
        packed = pack_batch(batch)
        (group,) = build_groups(packed, 2, None, torch.device("cpu"))
        assert group.runs is not None and len(group.runs) == 2  # slots 0-1 together, then 3
        for work, got in zip(batch, runner.forward(batch), strict=True):
            histories[work.slot].append(work.tokens[0])
            want = reference_logits(model.config, model.weights, histories[work.slot])[-1:]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
