"""The bridge between quantization and the on-disk cache (localinfer/quant_cache.py): each matrix
comes from a cache entry when one matches, else is quantized from the model file and kept for
the runner to save."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from localinfer.backends.torch.quant_dequant import DequantLinear
from localinfer.backends.torch.quant_kernels import KernelChooser
from localinfer.backends.torch.quant_layout import (
    QUANT_LAYOUT_VERSION,
    QuantMatrix,
    QuantSpec,
    quantize,
)
from localinfer.backends.torch.quant_linear import QuantLinear
from localinfer.backends.torch.quant_recipe import QuantRecipe, role_of
from localinfer.errors import ModelFileError
from localinfer.quant_cache import QuantCache, quant_cache_enabled

log = logging.getLogger(__name__)

Fetch = Callable[[], np.ndarray]


class WeightQuantizer:
    """Quantizes a model's matrices while the weights load, each as ``recipe`` says for its role:
    from ``cached`` (arrays of a quant_cache entry) when present, else from the source, quantized
    on the CPU and recorded in ``new_entries`` for the caller to cache."""

    def __init__(
        self,
        recipe: QuantRecipe,
        chooser: KernelChooser,
        cached: dict[str, dict[str, np.ndarray]] | None = None,
    ) -> None:
        self.recipe = recipe
        self.chooser = chooser
        self.cached = cached or {}
        self.new_entries: dict[str, dict[str, np.ndarray]] = {}
        self.cache_hits = 0

    def quantized(
        self, name: str, shape: tuple[int, int], fetch: Fetch, spec: QuantSpec | None = None
    ) -> QuantMatrix:
        """``fetch() -> np.ndarray [out, in]`` is called only on a cache miss. ``spec``: the
        recipe's for the role of ``name`` unless given."""
        spec = spec or self.recipe.spec_for(role_of(name))
        arrays = self.cached.get(name)
        if arrays is not None:
            try:
                qm = QuantMatrix.from_arrays(arrays)
                if qm.shape == shape and (qm.bits, qm.group_size) == (spec.bits, spec.group_size):
                    self.cache_hits += 1
                    return qm
            except (ValueError, KeyError):
                pass  # a stale or damaged entry: quantize again
        array = fetch()
        if tuple(array.shape) != shape:
            raise ModelFileError(name, f"shape {tuple(array.shape)}, expected {shape}")
        qm = quantize(torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)), spec)
        self.new_entries[name] = qm.to_arrays()
        return qm

    def matrix(self, name: str, shape: tuple[int, int], fetch: Fetch) -> QuantLinear:
        return self.chooser.build(self.quantized(name, shape, fetch))

    def table(self, name: str, shape: tuple[int, int], fetch: Fetch) -> DequantLinear:
        """A matrix whose rows are also gathered (the embedding): kept in the canonical layout."""
        return self.chooser.dequant(
            self.quantized(name, shape, fetch, self.recipe.spec_for("embed"))
        )

    def finish(self) -> None:
        self.cached = {}  # drop the memory maps once everything is copied


def cache_method(recipe: QuantRecipe) -> str:
    """The quant cache's key for this runner's layout of ``recipe`` (an entry whose matrix has
    other bits or groups than the recipe now asks is quantized again: see ``quantized``)."""
    return f"torch-{recipe.label}-v{QUANT_LAYOUT_VERSION}"


def open_quantizer(
    recipe: QuantRecipe, dtype: torch.dtype, device: torch.device, model_path: Path
) -> WeightQuantizer:
    """A quantizer for one load, seeded with the cache's entries for this file when any."""
    chooser = KernelChooser(recipe.bits, dtype, device)
    cached = None
    if quant_cache_enabled() and model_path.exists():
        cached = QuantCache().load(model_path, cache_method(recipe))
    return WeightQuantizer(recipe, chooser, cached)


def save_quantized(quantizer: WeightQuantizer, model_path: Path) -> None:
    """Cache what ``quantizer`` had to quantize afresh (nothing when the cache served it all)."""
    if not quantizer.new_entries or not quant_cache_enabled() or not model_path.exists():
        return
    try:
        QuantCache().save(model_path, cache_method(quantizer.recipe), quantizer.new_entries)
    except OSError as exc:  # a full or read-only cache costs speed next time, nothing else
        log.warning("could not cache quantized weights: %s", exc)
