"""llama.cpp's own high-level ``llama_cpp.Llama`` as a reference for tests and benchmarks, with its
weights loaded as the runner loads them.

Where ggml was compiled with AMX, llama.cpp repacks quantized weights into AMX buffers whose
matmul segfaults in this build (``weight_buffers`` in backends/llamacpp/native.py explains the
GCC bug). ``Llama`` takes no model params of its own, so the factory it reads them from is
swapped while the model loads: the reference then runs the same kernels and allocates the same
buffers as the runner.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localinfer.backends.llamacpp.native import weight_buffers


@contextmanager
def reference_llama(path: str | Path, **kwargs: Any) -> Iterator[Any]:
    """A ``llama_cpp.Llama(path, **kwargs)`` with the runner's weight buffers, closed on exit."""
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    defaults = low_level.llama_model_default_params
    low_level.llama_model_default_params = lambda: weight_buffers(defaults())
    try:
        llm = llama_cpp.Llama(str(path), **kwargs)
    finally:
        low_level.llama_model_default_params = defaults
    try:
        yield llm
    finally:
        llm.close()
