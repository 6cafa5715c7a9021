"""KQuantForm: a GGUF's matrices held quantized, converted from the stored bytes: a K-quant file's,
and a Q8_0 / Q4_0 / Q4_1 file's where the native CPU kernels do not keep its blocks
(kquant_rules.py decides which files, names each type's form and counts its bytes for the
budget; kquant_convert.py converts), multiplied by torch's packed kernels
(quant_kernels.PACKED_ORDER) on CPU and CUDA.

* A fused matrix (q|k|v, gate|up) is one kernel where its parts share a form, else a
  SplitLinear of one kernel per run of parts.
* The embedding table's rows are gathered from the canonical layout (only the gathered rows
  are dequantized); where the table is also the LM head, an int8 table is one object serving
  both, an int4 one gets a packed copy for the head (the packed layout cannot be gathered).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from localinfer.backends.torch.kquant_convert import compact, int4_matrix, int8_matrix, stack_rows
from localinfer.backends.torch.kquant_linear import DenseLinear, SplitLinear
from localinfer.backends.torch.kquant_rules import held_form, holds_converted
from localinfer.backends.torch.quant_kernels import PACKED_ORDER, KernelChooser
from localinfer.backends.torch.quant_layout import QuantMatrix
from localinfer.backends.torch.quant_linear import QuantLinear
from localinfer.backends.torch.weight_forms import StoredMatrix, TensorCopier, WeightForm
from localinfer.backends.torch.weights import Matrix
from localinfer.errors import ModelFileError
from localinfer.loading.gguf_weights import PERMUTED_QK_ARCHS, unpermute_qk
from localinfer.loading.model_config import ModelConfig

Held = QuantMatrix | np.ndarray  # int4 / int8 matrices; float32 values of a dense one


class StoredSource(Protocol):
    """A weight source that hands out stored bytes (GGUFWeights)."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> np.ndarray: ...

    def raw(self, name: str) -> np.ndarray: ...

    def quant_type(self, name: str) -> str: ...

    def shape(self, name: str) -> tuple[int, ...]: ...


def held_converted(source: object, blocks_kept: bool) -> bool:
    """Whether ``source`` is a GGUF whose matrices the runner holds converted (kquant_rules.
    holds_converted; ``blocks_kept``: the native CPU kernels would keep its blocks)."""
    if not all(hasattr(source, a) for a in ("names", "raw", "quant_type", "shape")):
        return False
    src: StoredSource = source  # type: ignore[assignment]
    names = [n for n in src.names() if len(src.shape(n)) == 2]
    return holds_converted(((src.quant_type(n), src.raw(n).nbytes) for n in names), blocks_kept)


class KQuantForm(WeightForm):
    quantized = True

    def __init__(
        self,
        tensors: TensorCopier,
        source: StoredSource,
        config: ModelConfig,
        chooser: KernelChooser,
    ) -> None:
        super().__init__(tensors)
        self.source = source
        self.config = config
        self.chooser = chooser
        self._exact_table: QuantMatrix | None = None  # an int4 table, for the tied head's copy

    def matrix(self, m: StoredMatrix) -> Matrix:
        runs = self._runs(m)
        linears = [self._linear(form, held, m.name) for form, held in runs]
        return linears[0] if len(linears) == 1 else SplitLinear(linears)

    def table(self, m: StoredMatrix) -> Matrix:
        ((form, held),) = self._runs(m)
        if isinstance(held, QuantMatrix) and form == "int4":
            self._exact_table = held
            return self.chooser.dequant(compact(held))
        return self._linear(form, held, m.name)

    def tied_head(self, table: Matrix) -> Matrix:
        exact, self._exact_table = self._exact_table, None
        if exact is None:
            return table  # int8 or dense: the same object multiplies and gathers
        head = self.chooser.build(exact)
        return table if head.kernel == "dequant" else head  # no packed kernel: share the table

    def finish(self) -> None:
        self._exact_table = None

    def _rows(self, name: str) -> np.ndarray:
        """Stored rows in Hugging Face order (llama.cpp permutes llama's Q/K rows for its RoPE:
        whole rows move, as GGUFWeights.get undoes it on the float values)."""
        rows = self.source.raw(name)
        c = self.config
        if c.arch in PERMUTED_QK_ARCHS:
            if ".self_attn.q_proj." in name:
                return unpermute_qk(rows, c.n_heads)
            if ".self_attn.k_proj." in name:
                return unpermute_qk(rows, c.n_kv_heads)
        return rows

    def _held(self, part: str, cols: int) -> tuple[str, Held]:
        type_name = self.source.quant_type(part)
        form = held_form(type_name)
        if form == "int4":
            try:
                return form, int4_matrix(type_name, self._rows(part), cols)
            except ValueError as exc:
                raise ModelFileError(part, str(exc)) from None
        values = self.source.get(part)
        if values.ndim != 2 or values.shape[1] != cols:
            raise ModelFileError(part, f"shape {values.shape}, expected rows of {cols}")
        return form, values if form == "dense" else int8_matrix(values)

    def _runs(self, m: StoredMatrix) -> list[tuple[str, Held]]:
        """The parts of ``m`` read in their forms, consecutive parts of one form stacked."""
        runs: list[tuple[str, list[Held]]] = []
        for part in m.parts:
            form, held = self._held(part, m.shape[1])
            if runs and runs[-1][0] == form:
                runs[-1][1].append(held)
            else:
                runs.append((form, [held]))
        out = [(form, _stack(form, parts)) for form, parts in runs]
        rows = sum(h.shape[0] for _, h in out)
        if rows != m.shape[0]:
            raise ModelFileError(m.name, f"{rows} rows, expected {m.shape[0]}")
        return out

    def _linear(self, form: str, held: Held, name: str) -> QuantLinear:
        if isinstance(held, np.ndarray):
            return DenseLinear(self.tensors.put(held, held.shape, name))
        ql = self.chooser.build(held)
        if ql.kernel == "dequant":
            ql.matrix = compact(ql.matrix)  # held as the budget counts it: float16 factors
        return ql


def _stack(form: str, parts: Sequence[Held]) -> Held:
    if form == "dense":
        return np.concatenate(parts)  # type: ignore[arg-type]
    return stack_rows(list(parts))  # type: ignore[arg-type]


def kquant_form(
    config: ModelConfig, source: StoredSource, dtype: torch.dtype, device: torch.device
) -> KQuantForm:
    chooser = KernelChooser(4, dtype, device, order=PACKED_ORDER)
    return KQuantForm(TensorCopier(dtype, device), source, config, chooser)
