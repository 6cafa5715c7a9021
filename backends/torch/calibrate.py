"""Measure, once per machine and kernel build, whether the native kernels beat torch ops here.

The kernels were written on an AVX-512 machine; on an AVX2 laptop or an ARM board the balance can
flip (a block decode that is one permute on AVX-512 is eight instructions on AVX2, a scalar loop
without either). So the runner does not assume: right after the library is built this times the
bare matrix product three ways over one weight matrix (3072 x 1024, 12 MB of float32, larger than
a laptop's L2), at 1, 8 and 32 tokens, on one thread (native_plan.CALIBRATION_THREADS says why):

- native on float32 rows (cpu_kernels.c's li_linear),
- native on the same shape as Q4_1 blocks (the embedded model's storage),
- torch ops on float32 (oneDNN packed where available, else F.linear): what the runner uses
  without the kernels.

Each is the fastest of several calls after a warm-up (about 0.1 s in all). The result is written
beside the library (native_plan.py reads it, torch-free, for the budget and backend choice).

A whole forward is more than its products: the torch path also runs the small ops around them
(norms, RoPE, cache writes, attention, SiLU, residual adds: about 30 per layer of model.py for 4
products), each paying torch's dispatch, while the kernels do that work inside one call. So the
time of TORCH_OPS_PER_PRODUCT such small ops, measured here on a decode-sized row, is added to
each torch product before comparing.

Run as ``python -m localinfer.backends.torch.calibrate THREADS`` it prints the result as JSON
(native_plan.py calls it so, from processes that have not imported torch).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from localinfer.backends.torch.block_weights import BlockMatrix, row_bytes
from localinfer.backends.torch.cpu_kernels import NativeKernels, load_kernels
from localinfer.backends.torch.native_plan import (
    CALIBRATION_THREADS,
    TOKEN_COUNTS,
    Calibration,
    ProductTimes,
    store_calibration,
)
from localinfer.backends.torch.onednn import linear_onednn, onednn_available, pack_onednn

SHAPE = (3072, 1024)  # out, in: between SmolLM2's FFN matrices and a 1-3B model's
REPEATS = 7
TORCH_OPS_PER_PRODUCT = 7  # ~30 small torch ops per layer of model.py / 4 matrix products


def _small_ops(row: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """TORCH_OPS_PER_PRODUCT decode-sized ops like those between a layer's products."""
    h = row * scale
    h = h.roll(h.shape[-1] // 2, dims=-1)
    h = torch.addcmul(h, row, scale)
    h = F.silu(h)
    h = h + row
    h = F.rms_norm(h, scale.shape, scale, 1e-5)
    return h[:, : h.shape[1] // 2].contiguous()


def _best_seconds(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    fn()  # warm-up: page faults, first-touch, oneDNN primitive creation
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def random_q4_1(shape: tuple[int, int], generator: torch.Generator) -> BlockMatrix:
    """Q4_1 block rows with random nibbles and small finite f16 scales (timing only)."""
    out, in_features = shape
    blocks = torch.randint(0, 256, (out, row_bytes("Q4_1", in_features)), dtype=torch.uint8,
                           generator=generator)  # fmt: skip
    per_row = blocks.view(out, -1, 20)
    scales = torch.full((out, per_row.shape[1], 2), 0.01, dtype=torch.float16)
    per_row[:, :, :4] = scales.view(torch.uint8).view(out, -1, 4)
    return BlockMatrix("Q4_1", blocks, in_features)


def measure(kernels: NativeKernels, threads: int) -> Calibration:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        dense = torch.randn(SHAPE, generator=gen) * 0.02
        blocks = random_q4_1(SHAPE, gen)
        onednn = onednn_available(torch.float32, torch.device("cpu"))
        ref_w = pack_onednn(dense) if onednn else dense
        ref = linear_onednn if onednn else F.linear
        rows = []
        row, scale = torch.randn(1, SHAPE[1], generator=gen), torch.rand(SHAPE[1], generator=gen)
        overhead = _best_seconds(lambda: _small_ops(row, scale))
        for tokens in TOKEN_COUNTS:
            x = torch.randn(tokens, SHAPE[1], generator=gen)
            rows.append(
                ProductTimes(
                    tokens=tokens,
                    native_f32=_best_seconds(lambda x=x: kernels.linear(x, dense, None, threads)),
                    native_q4_1=_best_seconds(lambda x=x: kernels.linear(x, blocks, None, threads)),
                    torch_f32=_best_seconds(lambda x=x: ref(x, ref_w)),
                )
            )
        return Calibration(
            isa=kernels.isa(),
            threads=threads,
            torch_overhead=overhead,
            products=tuple(rows),
        )
    finally:
        torch.set_num_threads(before)


def calibrate(threads: int) -> Calibration | None:
    """Measure and store (None when the kernels are unavailable here)."""
    kernels = load_kernels()
    if kernels is None:
        return None
    result = measure(kernels, threads)
    store_calibration(kernels.path, result)
    return result


def main(argv: list[str]) -> int:
    threads = int(argv[0]) if argv else CALIBRATION_THREADS
    result = calibrate(threads)
    print(json.dumps(None if result is None else result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
