"""Time llama.cpp's attention with flash attention on and off, on this CPU (attention_plan.py).

For each setting: a context of BATCHED sequences for the probe model of the asked attention heads
(attention_probe.py: the real model's heads, the rest shrunk), filled to each of DEPTHS tokens in
turn (a probe prefills them in milliseconds); at each depth the best of a few CHUNK-token forwards
and the median of a few one-token decode steps in one sequence, and the median of a few steps
decoding one token in every sequence. Both settings' contexts live side by side and are timed in
alternating rounds at each depth (time_settings), so the two see the same machine.

Run as ``python -m localinfer.backends.llamacpp.attention_calibrate THREADS HEADS KV_HEADS
HEAD_DIM``: prints the result as JSON and stores it for attention_plan.py; with ``--probe`` it
only loads llama.cpp and runs one forward of the embedded model (attention_plan.check_runs_here).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from localinfer.backends.base import RunnerConfig, SlotWork
from localinfer.backends.llamacpp import native
from localinfer.backends.llamacpp.attention_plan import (
    BATCHED,
    CHUNK,
    DEPTHS,
    AttentionCalibration,
    AttentionTimes,
    probe_folder,
    running_in_the_probe,
    store_calibration,
)
from localinfer.backends.llamacpp.attention_probe import PROBE_VOCAB, AttentionShape, probe_path
from localinfer.backends.llamacpp.batch import BatchBuffer
from localinfer.backends.llamacpp.runner import LlamaCppRunner
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model

DECODE_STEPS = 6
PREFILL_REPEATS = 2
BATCH = 512  # prefill rows per llama_decode
ROUNDS = 4  # rounds at each depth, the two settings in the order ABBA ABBA (time_settings)


class _ProbeContext:
    """A llama.cpp context on the probe model with flash attention ``flash``: BATCHED sequences,
    filled on from one depth to the next (a probe prefills them in milliseconds)."""

    def __init__(self, model_ptr: object, flash: bool, threads: int) -> None:
        llama = native.lib()
        params = llama.llama_context_default_params()
        cells = max(DEPTHS) + CHUNK + DECODE_STEPS + 8
        params.n_ctx = BATCHED * cells
        params.n_batch = params.n_ubatch = BATCH
        params.n_seq_max = BATCHED
        params.kv_unified = False  # as the runner: a KV stream per sequence
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        on, off = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.flash_attn_type = on if flash else off
        self.ctx = llama.llama_init_from_model(model_ptr, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context for the attention probe")
        self.forward = _forwarder(llama, self.ctx)
        self.filled = 0

    def fill_to(self, depth: int) -> None:
        ids = np.arange(depth, dtype=np.int32) % PROBE_VOCAB
        for seq in range(BATCHED):  # each sequence filled on from the last depth
            for start in range(self.filled, depth, BATCH):
                self.forward(ids[start : min(start + BATCH, depth)], start, seq)
        self.filled = depth

    def times_at(self, depth: int) -> tuple[float, ...]:
        return _times_at(self.forward, native.lib().llama_get_memory(self.ctx), depth)

    def close(self) -> None:
        native.lib().llama_free(self.ctx)


def time_settings(
    model_ptr: object, threads: int
) -> tuple[AttentionTimes, AttentionTimes, tuple[float, ...]]:
    """Both settings' times on the loaded probe model ``model_ptr`` (on, then off), each summed
    over DEPTHS: at each depth ROUNDS rounds alternate the two settings, and each time is the
    median of its rounds, so a machine whose speed drifts during the measurement (another
    program starting, a busy neighbour on a shared host) slows both settings alike. Also the
    share of the probe's turn that off saves in each round, summed over DEPTHS (the decision
    asks every round to agree: attention_plan.AttentionCalibration.flash_faster)."""
    probes: dict[bool, _ProbeContext] = {}
    # timed[flash][d][r]: the times at the d-th depth in round r
    timed: dict[bool, list[list[tuple[float, ...]]]] = {True: [], False: []}
    try:
        for flash in (True, False):
            probes[flash] = _ProbeContext(model_ptr, flash, threads)
        for depth in sorted(DEPTHS):
            for flash, probe in probes.items():
                probe.fill_to(depth)
                timed[flash].append([])
            for r in range(ROUNDS):
                for flash in (True, False) if r % 2 == 0 else (False, True):
                    timed[flash][-1].append(probes[flash].times_at(depth))
    finally:
        for probe in probes.values():
            probe.close()
    on, off = (_medians(flash, timed[flash]) for flash in (True, False))

    def turn(flash: bool, r: int) -> float:  # round r's times, summed over the depths
        return sum(sum(rounds[r]) for rounds in timed[flash])

    savings = tuple(1 - turn(False, r) / turn(True, r) for r in range(ROUNDS))
    return on, off, savings


def _medians(flash: bool, by_depth: list[list[tuple[float, ...]]]) -> AttentionTimes:
    """Each time's median over the rounds at each depth, summed over the depths."""
    per_depth = [[statistics.median(t) for t in zip(*rounds, strict=True)] for rounds in by_depth]
    decode, prefill, batched = (sum(col) for col in zip(*per_depth, strict=True))
    return AttentionTimes(flash=flash, decode=decode, prefill=prefill, batched=batched)


def _times_at(forward: Callable[..., None], memory: object, depth: int) -> tuple[float, ...]:
    """Seconds per token of a one-token step, a CHUNK-token forward and a step of BATCHED
    sequences, with every sequence holding ``depth`` cells (and left so)."""
    llama = native.lib()
    chunk = np.arange(CHUNK, dtype=np.int32) + 7
    chunks = []
    for _ in range(PREFILL_REPEATS + 1):  # the first warms up
        began = time.perf_counter()
        forward(chunk, depth)
        chunks.append((time.perf_counter() - began) / CHUNK)
        llama.llama_memory_seq_rm(memory, 0, depth, -1)
    steps, batched = [], []
    for i in range(DECODE_STEPS + 2):  # the first two warm up
        began = time.perf_counter()
        forward(np.array([9], dtype=np.int32), depth + i)
        steps.append(time.perf_counter() - began)
    llama.llama_memory_seq_rm(memory, 0, depth, -1)  # every sequence at depth again
    for i in range(DECODE_STEPS + 2):
        began = time.perf_counter()
        forward(np.full(BATCHED, 9, dtype=np.int32), depth + i, None)
        batched.append((time.perf_counter() - began) / BATCHED)
    for seq in range(BATCHED):
        llama.llama_memory_seq_rm(memory, seq, depth, -1)
    return statistics.median(steps[2:]), min(chunks[1:]), statistics.median(batched[2:])


def _forwarder(llama: object, ctx: object) -> Callable[..., None]:
    """A forward of token ids: from position ``start`` in sequence ``seq``, the last row output;
    or, with ``seq`` None, one token in each of BATCHED sequences at ``start``, each output."""
    batch = BatchBuffer(llama, BATCH)

    def forward(tokens: np.ndarray, start: int, seq: int | None = 0) -> None:
        n = len(tokens)
        if seq is None:
            want = np.ones(n, dtype=np.int8)
            pos = np.full(n, start, dtype=np.int32)
            seqs = np.arange(n, dtype=np.int32)
        else:
            want = np.zeros(n, dtype=np.int8)
            want[-1] = 1
            pos = np.arange(start, start + n, dtype=np.int32)
            seqs = np.full(n, seq, dtype=np.int32)
        batch.fill(tokens, pos, seqs, want)
        if llama.llama_decode(ctx, batch.batch) != 0:  # type: ignore[attr-defined]
            raise RuntimeError("llama_decode failed on the attention probe")

    return forward


def measure(threads: int, shape: AttentionShape) -> AttentionCalibration:
    llama = native.lib()
    path = probe_path(probe_folder(), shape)
    params = native.weight_buffers(llama.llama_model_default_params())
    model_ptr = llama.llama_model_load_from_file(str(path).encode(), params)
    if not model_ptr:
        raise RuntimeError(f"llama.cpp could not load the attention probe {path}")
    try:
        on, off, savings = time_settings(model_ptr, threads)
    finally:
        llama.llama_model_free(model_ptr)
    return AttentionCalibration(
        threads=threads, depths=DEPTHS, rows=(on, off), heads=shape.key, round_savings=savings
    )


def probe() -> dict:
    """Load llama.cpp and run one forward of the embedded model (attention_plan.check_runs_here)."""
    model = load_model(embedded_model_path())
    runner = LlamaCppRunner(model, RunnerConfig(slots=1, max_ctx=64, threads=1), flash_attn=False)
    try:
        (logits,) = runner.forward([SlotWork(0, tuple(range(100, 108)), 0)])
        return {"ok": bool(logits.size)}
    finally:
        runner.close()


def main(argv: list[str]) -> int:
    running_in_the_probe()
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    threads, heads, kv_heads, head_dim = (int(a) for a in argv[:4])
    result = measure(threads, AttentionShape(heads, kv_heads, head_dim))
    print(json.dumps(result.to_json()), flush=True)  # the parent reads it even if storing fails
    try:
        store_calibration(result)
    except OSError as exc:
        print(f"could not store the calibration: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
