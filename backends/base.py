"""The Runner seam: the one interface between the engine and a framework.

A runner owns the weights and a preallocated KV cache of ``slots x max_ctx`` cells. The engine
hands it a ragged batch of :class:`SlotWork` (each slot at its own position) and gets back float32
logits as numpy arrays, so nothing above this seam ever imports torch, mlx or llama_cpp.

Invariants every runner enforces (and the engine relies on):

* a slot's cache is contiguous: ``SlotWork.start_pos`` must equal the slot's cached length
  (:meth:`Runner.slot_length`); to rewrite history call :meth:`Runner.truncate` first;
* ``start_pos + len(tokens) <= max_ctx``, otherwise :class:`localinfer.errors.ContextOverflowError`
  is raised before any compute;
* one slot appears at most once per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

# Re-exported: the engine reaches the backends through this module alone.
from localinfer.backends import prompt_images as prompt_images  # images in prompts (#37)
from localinfer.backends.prompt_images import PromptImage
from localinfer.backends.runner_sampling import RunnerSampling
from localinfer.backends.runner_sampling import SamplesInRunner as SamplesInRunner
from localinfer.errors import ContextOverflowError
from localinfer.facts.pooling import Pooling

LogitsWanted = Literal["last", "all"]
# At most this many sequences share one embedding pass (llama.cpp: the embedding context's
# n_seq_max); a pass's padded cells (sequences x longest) stay within one slot's max_ctx.
EMBED_PASS_MAX_INPUTS = 64


@dataclass(slots=True, frozen=True)
class SlotWork:
    """Tokens to append to one slot's cache in this forward pass. With ``sample`` set (only with
    ``logits="last"``, and only for a runner that :class:`SamplesInRunner`), the runner returns
    the drawn token id as an int64 array ``[1]`` for this item instead of its logits.
    ``images``: the prompt's images with positions among these tokens, whose placeholder ids
    (prompt_images.py) a runner with ``vision`` feeds as the images' embeddings."""

    slot: int
    tokens: tuple[int, ...]
    start_pos: int
    logits: LogitsWanted = "last"
    sample: RunnerSampling | None = None
    images: tuple[PromptImage, ...] = ()

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("SlotWork needs at least one token")
        if self.start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {self.start_pos}")
        if self.sample is not None and self.logits != "last":
            raise ValueError("a runner samples only a slot's last row (logits='last')")


@dataclass(slots=True, frozen=True)
class RunnerConfig:
    """How to build a runner: sizes and numerics, chosen by the engine/CLI from the budget."""

    slots: int = 1
    max_ctx: int = 2048  # per slot
    dtype: str = "float32"  # float32 | bfloat16 | float16 (torch, mlx); ignored by llamacpp
    device: str = "cpu"  # cpu | cuda | cuda:N | metal
    threads: int | None = None  # None: the backend's default (physical cores)
    quant: str | None = None  # none | int8 | int4 | a GGUF type; None keeps the file's own
    # KV cache element type (f16 | bf16 | f32 | q8_0 | q4_0); None: the backend's own (llama.cpp
    # F16; torch and MLX the compute dtype, the only one they hold: select.py refuses another).
    kv_dtype: str | None = None
    # llama.cpp on a GPU: the layers it holds there, the rest on the CPU (partial offload, sized
    # by the budget); None: every layer. Ignored on the CPU and by the other runners.
    gpu_layers: int | None = None
    mmproj: str | None = None  # a vision projector (mmproj*.gguf) to load: llama.cpp only
    # llama.cpp across machines: the RPC workers (HOST:PORT) holding the last gpu_layers layers
    # (llama.cpp's count, the output layer included; budget/nodes.py sizes it), shared between
    # them as rpc_split (empty: by their memory). Ignored by the other runners.
    rpc: tuple[str, ...] = ()
    rpc_split: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.max_ctx < 1:
            raise ValueError(f"max_ctx must be >= 1, got {self.max_ctx}")


@dataclass(slots=True, frozen=True)
class RunnerInfo:
    """What a built runner is, for display and for the engine's bookkeeping."""

    backend: str  # torch | llamacpp | mlx
    device: str
    dtype: str
    slots: int
    max_ctx: int
    vocab_size: int
    quant: str  # e.g. "Q4_1", "fp32", "int8"

    @classmethod
    def from_config(
        cls,
        config: RunnerConfig,
        backend: str,
        device: str,
        vocab_size: int,
        quant: str,
        dtype: str | None = None,
    ) -> RunnerInfo:
        """A runner built from ``config``: its slots and context as asked, its dtype unless the
        backend computes in another (``dtype``)."""
        return cls(
            backend, device, dtype or config.dtype, config.slots, config.max_ctx, vocab_size, quant
        )


@dataclass(slots=True, frozen=True)
class MemoryReport:
    """Measured memory of a runner, in bytes (measured, not estimated)."""

    weights: int
    kv_cache: int
    overhead: int  # compute buffers and runtime allocations beyond weights + KV
    device: str

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead


@runtime_checkable
class Runner(Protocol):
    """A model runner. Not thread-safe: one engine thread owns it."""

    info: RunnerInfo

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        """Run one forward pass over a ragged batch.

        Returns one float32 array per item, in batch order: shape ``[1, vocab]`` for
        ``logits="last"`` and ``[len(tokens), vocab]`` for ``logits="all"``.
        """
        ...

    def slot_length(self, slot: int) -> int:
        """Number of tokens currently cached in ``slot``."""
        ...

    def truncate(self, slot: int, length: int) -> None:
        """Drop cached tokens of ``slot`` past ``length`` (speculative rollback, prefix reuse)."""
        ...

    def release(self, slot: int) -> None:
        """Forget everything cached in ``slot`` (same as ``truncate(slot, 0)``)."""
        ...

    def memory(self) -> MemoryReport:
        """Measured memory in use by weights, KV cache and overhead."""
        ...

    def close(self) -> None:
        """Free the weights and cache; the runner is unusable afterwards."""
        ...


# -- The KV cache (``runner.kv_cache``): prefix copies, the KV tiers, --cache-reuse ----------


@dataclass(slots=True, frozen=True)
class MovedChunk:
    """One piece of a spliced slot (:meth:`KVSplicer.splice`): the ``new`` tokens are prefilled,
    then the slot's cached cells ``[start, end)`` are moved to follow them."""

    new: tuple[int, ...]
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"moved chunk: need 0 <= start < end, got [{self.start}, {self.end})")


@runtime_checkable
class KVSplicer(Protocol):
    """What a runner's KV cache (:class:`KVCache`) offers behind ``--cache-reuse``: move cached
    cells to new positions. Without it, cache reuse is served as plain prefix reuse."""

    def splice(self, slot: int, keep: int, chunks: Sequence[MovedChunk]) -> None:
        """Rebuild ``slot`` as: its cells ``[0, keep)`` as they are, then for each chunk its
        ``new`` tokens prefilled and its cells ``[start, end)`` moved after them, keys
        re-rotated to their new positions. Every other cell is dropped; the slot then holds
        ``keep + sum(len(new) + end - start)`` cells. Chunks come in ascending order, disjoint,
        within ``[keep, slot_length)``; anything else raises before the slot changes.

        An approximation: a moved chunk's keys and values were computed without the new text
        before it. How the new tokens are computed is each runner's own: torch and MLX compute
        them seeing only what precedes them; llama.cpp (whose cache cannot hold a gap to fill
        later) computes them after every moved chunk, seeing those too, then moves them into
        place. Whatever fails, cells ``[0, keep)`` stay intact (truncate there to recover); a
        runner that cannot move this model's cells raises NotImplementedError before any change.
        """
        ...


@dataclass(slots=True, frozen=True)
class KVSnapshot:
    """A slot's first ``n_tokens`` cached cells, copied to host memory (``KVTransfer``).

    ``layout`` names everything a restore must match (backend, dtype / KV type, layers, KV heads,
    head size, the model's identity as the runner knows it): a snapshot restores only into a runner
    whose ``kv_cache.layout()`` equals it. ``payload`` is opaque bytes in that runner's own format,
    so the engine's RAM and disk tiers can hold and write it without knowing any framework."""

    layout: str
    n_tokens: int
    payload: bytes

    def __post_init__(self) -> None:
        if self.n_tokens < 1:
            raise ValueError(f"KVSnapshot needs at least one token, got {self.n_tokens}")

    @property
    def nbytes(self) -> int:
        return len(self.payload)


@runtime_checkable
class KVTransfer(Protocol):
    """What a runner's KV cache (:class:`KVCache`) offers behind the KV tiers (issue #24): copy a
    prefix between slots, and move a slot's cells to host memory and back. Without it, every
    request is served with plain per-slot prefix reuse.

    Every method validates before it changes anything: on a ValueError the target slot is as it
    was. Keys stay at their absolute positions (a prefix is copied to the same positions), so no
    re-rotation is needed."""

    def layout(self) -> str:
        """The compatibility key a snapshot of this cache carries (``KVSnapshot.layout``)."""
        ...

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Make ``dst`` hold exactly ``src``'s first ``n_tokens`` cells (``dst``'s previous cells
        are dropped; ``src`` is unchanged and may be mid-generation). ``src != dst``,
        ``1 <= n_tokens <= slot_length(src)``."""
        ...

    def snapshot(self, slot: int, n_tokens: int) -> KVSnapshot:
        """Copy ``slot``'s first ``n_tokens`` cells (``1 <= n_tokens <= slot_length(slot)``) to host
        memory; the slot is unchanged."""
        ...

    def restore(self, slot: int, snapshot: KVSnapshot) -> None:
        """Make ``slot`` hold exactly the snapshot's cells (its previous cells are dropped).
        ValueError when ``snapshot.layout != layout()``, the payload is malformed, or it does not
        fit ``max_ctx``."""
        ...


@runtime_checkable
class KVCache(KVTransfer, KVSplicer, Protocol):
    """A runner's KV cache as prefix reuse, the KV tiers and cache reuse use it: the public
    ``kv_cache`` attribute of the torch, MLX and llama.cpp runners, one object per runner.

    It works on the runner's own cells and slot lengths: what a method here changes,
    ``Runner.slot_length`` reports. It is unusable once the runner is closed (RuntimeError). The
    engine asks for each part on its own (:func:`kv_transfer`, :func:`kv_splicer`), so a runner
    may offer either, or neither (no ``kv_cache``)."""


def kv_transfer(runner: object) -> KVTransfer | None:
    """``runner.kv_cache`` when it copies, snapshots and restores cells; None otherwise."""
    cache = getattr(runner, "kv_cache", None)
    return cache if isinstance(cache, KVTransfer) else None


def kv_splicer(runner: object) -> KVSplicer | None:
    """``runner.kv_cache`` when it moves cells (``--cache-reuse``); None otherwise."""
    cache = getattr(runner, "kv_cache", None)
    return cache if isinstance(cache, KVSplicer) else None


def check_batch(batch: Sequence[SlotWork], lengths: Sequence[int], max_ctx: int) -> None:
    """Validate a batch against the invariants in the module docstring (shared by all runners)."""
    seen: set[int] = set()
    for work in batch:
        if not 0 <= work.slot < len(lengths):
            raise ValueError(f"slot {work.slot} out of range (runner has {len(lengths)} slots)")
        if work.slot in seen:
            raise ValueError(f"slot {work.slot} appears twice in one batch")
        seen.add(work.slot)
        if work.start_pos != lengths[work.slot]:
            raise ValueError(
                f"slot {work.slot}: start_pos {work.start_pos} != cached length "
                f"{lengths[work.slot]}; truncate first"
            )
        end = work.start_pos + len(work.tokens)
        if end > max_ctx:
            raise ContextOverflowError(requested=end, limit=max_ctx)


@runtime_checkable
class SyntheticFill(Protocol):
    """Optional runner capability for measurements: make a slot hold ``n_tokens`` cached cells
    of arbitrary content in milliseconds, where prefilling them would take seconds. Timing and
    memory do not depend on what the cells hold (a forward at depth n attends over n cells)."""

    def fill_synthetic(self, slot: int, n_tokens: int) -> None: ...


class EmbeddingPass(Protocol):
    """Pooled embeddings of a few token sequences, computed in pieces (see EmbeddingRunner).

    A pass owns its scratch KV (never a slot's), so it may run between or beside the engine's
    forwards; ``close`` frees it. Sequences are fed in order, each as far as the budget goes."""

    @property
    def done(self) -> bool:
        """Every token of every sequence has been through the model."""
        ...

    def feed(self, max_tokens: int) -> int:
        """Run up to ``max_tokens`` (at least one) more tokens; returns how many ran."""
        ...

    def vectors(self) -> np.ndarray:
        """``[n, hidden]`` float32, each row of unit L2 norm; only once ``done``."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class EmbeddingRunner(Protocol):
    """A runner that also embeds: the final hidden state, normed as before the LM head, pooled
    per sequence and L2-normalised."""

    def start_embedding(self, inputs: Sequence[Sequence[int]], pooling: Pooling) -> EmbeddingPass:
        """A pass over ``inputs`` (each non-empty, within max_ctx, one of
        :func:`plan_embedding_passes`' groups); raises before any compute when they are not."""
        ...

    def embed(self, inputs: Sequence[Sequence[int]], pooling: Pooling) -> np.ndarray:
        """``[len(inputs), hidden]`` float32 unit vectors, in input order, all at once."""
        ...


def plan_embedding_passes(
    lengths: Sequence[int], max_cells: int, max_inputs: int = EMBED_PASS_MAX_INPUTS
) -> list[list[int]]:
    """Input indices grouped into passes: sorted by length so a pass pads little, each pass at
    most ``max_inputs`` sequences whose count x longest length stays within ``max_cells`` (a
    longer single input gets a pass of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    passes: list[list[int]] = []
    for i in order:
        group = passes[-1] if passes else None
        # Sorted ascending, so this input is the group's longest once added.
        if group and len(group) < max_inputs and (len(group) + 1) * lengths[i] <= max_cells:
            group.append(i)
        else:
            passes.append([i])
    return passes


def embed_all(
    runner: EmbeddingRunner,
    inputs: Sequence[Sequence[int]],
    pooling: Pooling,
    max_cells: int,
    chunk: int = 512,
) -> np.ndarray:
    """Every input's vector, pass after pass (``plan_embedding_passes``), in input order."""
    out: np.ndarray | None = None
    for group in plan_embedding_passes([len(x) for x in inputs], max_cells):
        embedding = runner.start_embedding([inputs[i] for i in group], pooling)
        try:
            while not embedding.done:
                embedding.feed(chunk)
            vectors = embedding.vectors()
        finally:
            embedding.close()
        if out is None:
            out = np.empty((len(inputs), vectors.shape[1]), dtype=np.float32)
        out[group] = vectors
    if out is None:
        raise ValueError("nothing to embed")
    return out
