"""llama.cpp's multimodal library used directly, through llama-cpp-python's ``mtmd_cpp``
bindings, as its own tools use it (mtmd-cli.cpp): one context, ``mtmd_tokenize`` with the default
marker, ``mtmd_helper_eval_chunks`` for the prompt, then one token at a time, greedy. The
reference the runner's image path is held to."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localinfer.backends.llamacpp import native
from localinfer.backends.prompt_images import RGBImage


def mtmd_greedy(
    model_path: Path,
    projector: Path,
    text: str,
    images: Sequence[RGBImage],
    n_new: int,
    *,
    n_ctx: int = 256,
) -> tuple[np.ndarray, list[int]]:
    """The logits each of ``n_new`` greedy tokens was drawn from (``[n_new, vocab]``, the first
    row the prompt's last) and the tokens; ``text`` marks each image with mtmd's default
    marker."""
    llama, mtmd = native.lib(), native.mtmd()
    model = llama.llama_model_load_from_file(str(model_path).encode(), native.weight_buffers(
        llama.llama_model_default_params()))  # fmt: skip
    params = llama.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, 512
    params.n_threads = params.n_threads_batch = 1
    params.swa_full = True  # as the runner keeps sliding layers' cells (context_shape.py)
    params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED  # as tests pin the runner's
    ctx = llama.llama_init_from_model(model, params)
    mparams = mtmd.mtmd_context_params_default()
    mparams.use_gpu, mparams.n_threads, mparams.print_timings = False, 1, False
    vision = mtmd.mtmd_init_from_file(str(projector).encode(), model, mparams)
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        bitmaps = [
            mtmd.mtmd_bitmap_init(
                i.width, i.height, (ctypes.c_uint8 * len(i.pixels)).from_buffer_copy(i.pixels)
            )
            for i in images
        ]
        raw = text.encode()
        entry = mtmd.mtmd_input_text(raw, len(raw), False, True)
        array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        assert mtmd.mtmd_tokenize(vision, chunks, ctypes.byref(entry), array, len(bitmaps)) == 0
        for bitmap in bitmaps:
            mtmd.mtmd_bitmap_free(bitmap)
        n_past = llama.llama_pos(0)
        past = ctypes.byref(n_past)
        assert mtmd.mtmd_helper_eval_chunks(vision, ctx, chunks, 0, 0, 512, True, past) == 0
        vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        rows = [np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, -1), shape=(vocab,)).copy()]
        tokens = [int(rows[0].argmax())]
        pos = n_past.value
        batch = llama.llama_batch_init(1, 0, 1)
        for _ in range(n_new - 1):
            batch.n_tokens = 1
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = tokens[-1], pos, 1
            batch.seq_id[0][0], batch.logits[0] = 0, 1
            assert llama.llama_decode(ctx, batch) == 0
            row = np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, -1), shape=(vocab,))
            rows.append(row.copy())
            tokens.append(int(row.argmax()))
            pos += 1
        llama.llama_batch_free(batch)
        return np.stack(rows), tokens
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_free(vision)
        llama.llama_free(ctx)
        llama.llama_model_free(model)
