"""The llama.cpp context the runner creates, as numbers both the runner and the budget use.

The runner asks llama.cpp for these (runner.py); the budget costs the same figures
(profile.py), so a rule changed here changes both. Nothing here imports llama_cpp.

- Cells: llama.cpp rounds ``n_ctx`` up to a multiple of 256, gives each of the ``n_seq_max``
  sequences ``n_ctx / n_seq_max`` cells (the runner's ``kv_unified = false``), again rounded up
  to 256 (src/llama-context.cpp).
- Sliding-window layers (Gemma 3): the runner keeps llama.cpp's full-size SWA cache
  (``swa_full``), every cell of the context on every layer. A window-sized one (window + n_ubatch
  cells) forgets positions older than the window as the sequence grows, so a slot could not be
  truncated back to an earlier length (prefix reuse, speculative rollback, snapshots) without
  recomputing it.
- Output rows: llama.cpp reserves its logits for ``n_outputs_max`` rows per decode call, in the
  compute graph (at vocab x 4 bytes a row: 1 MiB at a 262k vocabulary) and in the output buffer,
  and aborts on a call that asks for more. The engine asks for one row per slot, plus k + 1 for a
  slot verifying k speculative proposals; the runner splits a call that asks for more (batch.py).
"""

from __future__ import annotations

CELL_PADDING = 256  # GGML_PAD(n_ctx, 256) and GGML_PAD(n_ctx_seq, 256) in llama-context.cpp
FULL_SLIDING_CACHE = True  # llama_context_params.swa_full, as the runner sets it
# Rows one decode call may output beyond one per slot: two slots verifying 16 proposals each
# (SpecConfig.k_max), the most the engine's CPU policy speculates on at once.
SPARE_OUTPUT_ROWS = 32


def _pad(n: int) -> int:
    return -(-n // CELL_PADDING) * CELL_PADDING


def cells_per_sequence(ctx: int, slots: int) -> int:
    """KV cells each sequence owns on a full-attention layer (llama_n_ctx_seq)."""
    return _pad(_pad(ctx * slots) // slots)


def sliding_cells(ctx: int, slots: int, window: int, n_ubatch: int) -> int:
    """KV cells each sequence owns on a sliding-window layer (llama-kv-cache-iswa.cpp)."""
    full = cells_per_sequence(ctx, slots)
    if FULL_SLIDING_CACHE:
        return full
    return _pad(min(full, window + n_ubatch))


def output_rows(slots: int, n_batch: int) -> int:
    """llama.cpp's n_outputs_max: the logits rows one decode call reserves and may output."""
    return min(n_batch, slots + SPARE_OUTPUT_ROWS)
