"""Images on the llama.cpp runner: the model's vision projector through llama.cpp's multimodal
library (libmtmd, llama-cpp-python's ``mtmd_cpp`` bindings), as ``runner.vision``.

``prompt`` is mtmd's own tokenizer: the text, with :data:`IMAGE_MARKER` where each image goes,
becomes text chunks (the text model's token ids; the projector's wrapping tokens, Gemma 3's
``<start_of_image>``, added around each image) and image chunks (the picture resized and
normalised as the projector wants it). Each image chunk is copied out and kept with its
:class:`PromptImage`, freed when that is dropped; mtmd documents its tokenizer as safe to call
from any thread. ``encode`` runs the projector on one image (on the engine thread) and keeps the
last few results, so an image the prefill meets again is not encoded twice.

With a text model that places image tokens by M-RoPE (Qwen2-VL, Qwen2.5-VL and later Qwen VL
models: ``mrope``), an image takes fewer positions than tokens (``n_pos``), and ``positions``
gives each of its tokens the four that mtmd's own helper gives them (the runner's bookkeeping is
mrope.py's).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import sys
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from localinfer.backends.llamacpp import native
from localinfer.backends.llamacpp.buffers import parse_buffers
from localinfer.backends.prompt_images import (
    IMAGE_MARKER,
    ImagePrompt,
    PromptImage,
    RGBImage,
    image_token_ids,
)
from localinfer.errors import ModelFileError

TEXT_CHUNK, IMAGE_CHUNK = 0, 1  # mtmd_input_chunk_type
ENCODED_KEPT = 4  # images whose embeddings stay cached (a prompt's few, or a turn's one)
_MODEL_SIZE_RE = re.compile(r"model size:\s+([\d.]+) MiB")


def resident_bytes(trim: bool = False) -> int | None:
    """This process's resident set in bytes (Linux's /proc; None elsewhere). ``trim``: first
    hand glibc's free heap back (loading a projector frees ~0.7 MiB of temporaries a layer,
    which the heap would keep and the process reuse), so the figure is what is held."""
    if trim and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class _OwnedChunk:
    """An image chunk copied out of a tokenized prompt; freed once nothing refers to it.
    ``n_pos``: the positions of the sequence it takes (mtmd_input_chunk_get_n_pos)."""

    def __init__(self, mtmd: ModuleType, ptr: int) -> None:
        self.ptr = ptr
        self.n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(ptr))
        weakref.finalize(self, mtmd.mtmd_input_chunk_free, ptr)


def _owned(image: PromptImage) -> _OwnedChunk:
    if not isinstance(image.data, _OwnedChunk):
        raise ValueError("this image was not prepared by this runner's projector")
    return image.data


class LlamaCppVision:
    """The projector loaded beside a llama.cpp model (VisionInput)."""

    def __init__(
        self, llama: ModuleType, model_ptr: object, projector: Path, threads: int, gpu: bool
    ) -> None:
        self._mtmd = mtmd = native.mtmd()
        self._marker = IMAGE_MARKER.encode()  # referenced until init has copied it
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = gpu
        params.n_threads = threads
        params.print_timings = False
        params.media_marker = self._marker
        capture = native.LogCapture()
        before = resident_bytes(trim=True)
        with native.listen(capture):
            ctx = mtmd.mtmd_init_from_file(str(projector).encode(), model_ptr, params)
        after = resident_bytes(trim=True)
        # `budget --verify` compares it with the budget's projector (localinfer/budget/vision.py)
        self._load_growth = None if before is None or after is None else after - before
        if not ctx:
            reasons = capture.errors()
            reason = reasons[0] if reasons else "llama.cpp's multimodal library refused it"
            raise ModelFileError(projector, f"not a vision projector for this model: {reason}")
        self._ctx = ctx
        self._lock = threading.Lock()  # the context's life: prompts and encodes against close
        self._encoded: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        if not mtmd.mtmd_support_vision(ctx):
            self.close()
            why = "it reads audio only, which localinfer's llama.cpp runner does not run yet"
            raise ModelFileError(projector, why)
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ctx))  # positions(): four a token
        self.path = projector
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        self.width = int(llama.llama_model_n_embd_inp(model_ptr))
        text = capture.text()
        found = _MODEL_SIZE_RE.search(text)
        self.weight_bytes = round(float(found.group(1)) * 2**20) if found else 0
        self.compute_bytes = parse_buffers(text).compute

    def prompt(self, text: str, images: Sequence[RGBImage], bos: int | None) -> ImagePrompt:
        markers = text.count(IMAGE_MARKER)
        if markers != len(images):
            raise ValueError(f"the prompt places {markers} images but {len(images)} were given")
        mtmd = self._mtmd
        bitmaps = [self._bitmap(image) for image in images]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            raw = text.encode("utf-8", errors="surrogatepass")
            entry = mtmd.mtmd_input_text(raw, len(raw), False, True)  # special tokens parsed
            array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self._lock:
                self._require_open()
                rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(entry), array, len(bitmaps))
            if rc != 0:
                raise ValueError(f"llama.cpp's multimodal tokenizer refused the prompt (code {rc})")
            return self._walk(chunks, images, bos)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: RGBImage) -> int:
        data = (ctypes.c_uint8 * len(image.pixels)).from_buffer_copy(image.pixels)
        bitmap = self._mtmd.mtmd_bitmap_init(image.width, image.height, data)
        if not bitmap:
            raise ValueError(f"llama.cpp could not take a {image.width}x{image.height} image")
        self._mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
        return bitmap

    def _walk(self, chunks: int, images: Sequence[RGBImage], bos: int | None) -> ImagePrompt:
        """The ids and images of a tokenized prompt's chunks."""
        mtmd = self._mtmd
        ids: list[int] = [] if bos is None else [bos]
        found: list[PromptImage] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == TEXT_CHUNK:
                n = ctypes.c_size_t()
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(int(tokens[j]) for j in range(n.value))
                continue
            if kind != IMAGE_CHUNK:
                raise ValueError("the prompt holds a part that is not text or an image")
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            digest = images[len(found)].digest
            owned = _OwnedChunk(mtmd, mtmd.mtmd_input_chunk_copy(chunk))
            found.append(PromptImage(len(ids), n_tokens, digest, owned))
            ids.extend(image_token_ids(digest, n_tokens))
        return ImagePrompt(ids, tuple(found))

    def encode(self, image: PromptImage) -> np.ndarray:
        """The image's embeddings, ``[n_tokens, width]`` float32, as the text model takes them."""
        cached = self._encoded.get(image.digest)
        if cached is not None and len(cached) == image.n_tokens:
            self._encoded.move_to_end(image.digest)
            return cached
        chunk = _owned(image)
        with self._lock:
            self._require_open()
            rc = self._mtmd.mtmd_encode_chunk(self._ctx, chunk.ptr)
            if rc != 0:
                raise RuntimeError(f"the vision projector failed on an image (code {rc})")
            out = self._mtmd.mtmd_get_output_embd(self._ctx)
            embeddings = np.ctypeslib.as_array(out, shape=(image.n_tokens, self.width)).copy()
        self._encoded[image.digest] = embeddings
        while len(self._encoded) > ENCODED_KEPT:
            self._encoded.popitem(last=False)
        return embeddings

    def n_pos(self, image: PromptImage) -> int:
        """The positions of the sequence the image takes (its tokens' count without M-RoPE)."""
        return _owned(image).n_pos

    def positions(self, image: PromptImage, first: int) -> np.ndarray:
        """The M-RoPE positions of the image's tokens when its first takes position ``first``:
        ``[4, n_tokens]`` int32, the sections llama_batch takes (time, row, column, 0), as
        mtmd_helper_decode_image_chunk lays them out."""
        chunk, mtmd = _owned(image), self._mtmd
        out = (mtmd.mtmd_decoder_pos * image.n_tokens)()
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk.ptr)
        mtmd.mtmd_helper_image_get_decoder_pos(tokens, first, out)
        raw = np.frombuffer(out, dtype=np.uint32).reshape(image.n_tokens, 4)  # t, x, y, z
        return np.ascontiguousarray(raw[:, [0, 2, 1, 3]].T, dtype=np.int32)

    def load_growth(self) -> int | None:
        return self._load_growth

    def cached_bytes(self) -> int:
        """Host memory the kept embeddings take."""
        return sum(e.nbytes for e in self._encoded.values())

    def close(self) -> None:
        with self._lock:
            if self._ctx:
                self._mtmd.mtmd_free(self._ctx)
                self._ctx = None
        self._encoded.clear()

    def _require_open(self) -> None:
        if not self._ctx:
            raise RuntimeError("this model's vision projector is closed")
