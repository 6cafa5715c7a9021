"""The torch runner's decode step on CUDA, replayed from CUDA graphs instead of launched op by op.

An eager decode step launches well over a thousand small kernels (about 1,655 aten ops for the
Qwen3-8B layout), each costing the host more than the device spends on it at a few tokens a step.
The step's pieces (decode_pieces.py: everything but attention, over static buffers) are captured
per batch size, one graph each; a step replays them with attention run eagerly in between (flash
SDPA on mask-free decode runs, attention.py), so a graph never depends on the streams' lengths.
Every batch size shares the buffers and one memory pool: steps never overlap, and nothing passes
between pieces but the buffers. Sampling stays outside the graphs (sampling.py).

A batch size is captured the first time a decode batch of that size arrives: that step runs the
pieces eagerly on the capture stream (the warm-up torch asks for before a capture, and the step's
real result: it writes the same K/V a replay would), then captures them, which runs nothing.
A capture that fails turns graphs off for the runner with a warning; that step's result stands.

``LOCALINFER_CUDA_GRAPHS=0`` keeps every CUDA step eager (benchmarks, debugging).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from localinfer.backends.base import SlotWork
from localinfer.backends.ragged_batch import PackedBatch
from localinfer.backends.torch.attention import GroupTensors
from localinfer.backends.torch.decode_pieces import DecodePieces, is_decode_batch
from localinfer.backends.torch.kv_cache import StaticKVCache
from localinfer.backends.torch.model import LlamaModel

log = logging.getLogger(__name__)

DISABLE_ENV = "LOCALINFER_CUDA_GRAPHS"  # "0": every CUDA step eager


def graphs_wanted(device: torch.device) -> bool:
    """Whether a runner on ``device`` replays its decode steps from CUDA graphs."""
    return device.type == "cuda" and os.environ.get(DISABLE_ENV, "1") != "0"


class DecodeGraphs:
    """Captured decode steps of one runner's model and cache (module doc)."""

    def __init__(self, model: LlamaModel, cache: StaticKVCache, slots: int) -> None:
        self._pieces = DecodePieces(model, cache, slots)
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}  # batch size -> its pieces
        self._device = model.cos.device
        self._pool = torch.cuda.graph_pool_handle()
        self._stream = torch.cuda.Stream(device=self._device)
        self.enabled = True

    @property
    def captured(self) -> list[int]:
        """The batch sizes captured so far."""
        return sorted(self._graphs)

    def handles(self, batch: Sequence[SlotWork]) -> bool:
        """A pure decode batch that fits the buffers, while capture has not failed."""
        return self.enabled and is_decode_batch(batch, self._pieces.max_batch)

    def logits(self, packed: PackedBatch, groups: list[GroupTensors]) -> torch.Tensor:
        """The step's logits [B, vocab] float32 in packed order, its K/V written into the cache.
        A view of a static buffer: valid until the next step."""
        pieces = self._pieces
        b = pieces.load(packed)
        graphs = self._graphs.get(b)
        if graphs is None:
            return self._first(b, groups)
        graphs[0].replay()
        for i, graph in enumerate(graphs[1:]):
            pieces.attend(b, i, groups)
            graph.replay()
        return pieces.logits(b)

    def _first(self, b: int, groups: list[GroupTensors]) -> torch.Tensor:
        """A step of a batch size not captured yet: run eagerly on the capture stream, then
        captured (module doc)."""
        pieces, stream = self._pieces, self._stream
        main = torch.cuda.current_stream(self._device)
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            pieces.run(b, groups)
        main.wait_stream(stream)
        graphs = []
        try:
            for j in range(pieces.n_layers + 1):
                graph = torch.cuda.CUDAGraph()
                # thread_local: CUDA calls another thread makes meanwhile (a server's other
                # runner) neither fail nor spoil this capture; this thread makes none.
                capture = torch.cuda.graph(
                    graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"
                )
                with capture:
                    pieces.piece(b, j)
                graphs.append(graph)
        except RuntimeError as exc:  # what torch raises for an op it cannot capture
            log.warning("CUDA graph capture failed, decode steps stay eager: %s", exc)
            self.enabled = False
            return pieces.logits(b)
        self._graphs[b] = graphs
        return pieces.logits(b)
