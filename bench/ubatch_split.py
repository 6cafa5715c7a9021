"""One wave of fresh prompts beside cached ones, and plain decode steps, through llama.cpp's own API
with flash attention on and off.

The context is llama-server's with ``-np 8 --no-kv-unified`` (a KV stream per sequence, n_batch
2048, n_ubatch 512), so a batch splits into ubatches of consecutive sequence ids with equal token
counts as it does there and in the runner. The wave: sequences 0-3 prefill 7, 8, 9 and 10 fresh
tokens while 4-7, holding 83, 63, 83 and 68 cached cells, each take one (five ubatches). Then
8 sequences decode one token each at several depths. Printed: median ms per forward.

    python -m bench.ubatch_split [--threads 2] [--repeats 7] [--depths 32,128,256,512,1000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

SLOTS = 8
WAVE_FRESH = (7, 8, 9, 10)  # sequences 0-3
WAVE_CACHED = {4: 83, 5: 63, 6: 83, 7: 68}  # sequence -> cells it holds
Item = tuple[int, int, int]  # sequence, first position, tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ubatch_split", description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--depths", default="32,128,256,512,1000")
    return p.parse_args(argv)


def decode(llama: Any, ctx: Any, items: Sequence[Item]) -> float:
    """Seconds for one llama_decode of ``items`` (a logits row at each item's last token)."""
    n = sum(k for _, _, k in items)
    batch = llama.llama_batch_init(n, 0, 1)
    try:
        i = 0
        for seq, start, k in items:
            for j in range(k):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = 300 + j, start + j, 1
                batch.seq_id[i][0], batch.logits[i] = seq, j == k - 1
                i += 1
        batch.n_tokens = n
        began = time.perf_counter()
        if llama.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        llama.llama_synchronize(ctx)
        return time.perf_counter() - began
    finally:
        llama.llama_batch_free(batch)


def measure(llama: Any, model: Any, flash: bool, args: argparse.Namespace) -> str:
    params = llama.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = SLOTS * 1024, SLOTS, False
    params.n_threads = params.n_threads_batch = args.threads
    params.n_batch, params.n_ubatch = 2048, 512
    on, off = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.flash_attn_type = on if flash else off
    ctx = llama.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create the context")
    try:
        mem = llama.llama_get_memory(ctx)
        for seq, cells in WAVE_CACHED.items():
            decode(llama, ctx, [(seq, 0, cells)])
        wave = [(s, 0, k) for s, k in enumerate(WAVE_FRESH)]
        wave += [(s, cells, 1) for s, cells in WAVE_CACHED.items()]
        times = []
        for _ in range(args.repeats):
            for seq in range(SLOTS):
                llama.llama_memory_seq_rm(mem, seq, WAVE_CACHED.get(seq, 0), -1)
            times.append(decode(llama, ctx, wave))
        cells = [f"wave {statistics.median(times) * 1000:.1f} ms"]
        for depth in (int(d) for d in args.depths.split(",") if d):
            for seq in range(SLOTS):
                llama.llama_memory_seq_rm(mem, seq, 0, -1)
                decode(llama, ctx, [(seq, 0, depth)])
            steps = [decode(llama, ctx, [(s, depth + k, 1) for s in range(SLOTS)])
                     for k in range(args.repeats)]  # fmt: skip
            cells.append(f"8x1 at {depth}: {statistics.median(steps) * 1000:.1f} ms")
        return f"flash attention {'on ' if flash else 'off'}: " + ", ".join(cells)
    finally:
        llama.llama_free(ctx)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from localinfer.backends.llamacpp.omp_wait import prepare_omp_wait

    prepare_omp_wait()  # the runner's wait, before llama_cpp loads
    from localinfer.backends.llamacpp import native
    from localinfer.loading.embedded import embedded_model_path

    llama = native.lib()
    params = native.weight_buffers(llama.llama_model_default_params())
    model = llama.llama_model_load_from_file(str(embedded_model_path()).encode(), params)
    if not model:
        raise RuntimeError("llama.cpp could not load the embedded model")
    try:
        for flash in (True, False):
            print(measure(llama, model, flash, args), flush=True)
    finally:
        llama.llama_model_free(model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
