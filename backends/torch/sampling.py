"""Drawing tokens inside the torch runner, on the logits' own device: only the drawn ids cross to
the host, not a vocabulary-sized row per item (on CUDA, the copy this saves).

Greedy is ``argmax`` (the first index on ties, as the host's ``np.argmax``). A seeded draw comes
from the distribution the engine's host sampler defines (engine/sampling_exact.py): temperature
(float32 division), top-k keeping every token tied with the k-th largest, softmax in float64,
min-p against the most probable token, top-p as the shortest head (highest probability first,
the lower id first among equal ones) reaching ``top_p`` of the mass, then one uniform draw from
what is left. All rows are sorted once, descending and stable, so each cut is a prefix of the
sorted row. Each request draws with its own ``torch.Generator`` on the runner's device, seeded
with ``RunnerSampling.seed`` when its ``stream`` first appears: the same distribution as the
host, not the same tokens (another generator). tests/test_torch_sampling.py compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from localinfer.backends.runner_sampling import RunnerSampling


@dataclass(slots=True)
class _Stream:
    stream: int
    generator: torch.Generator


class DeviceSamplers:
    """One generator per slot, started when a new stream arrives there, dropped on release."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._streams: dict[int, _Stream] = {}

    def draw(
        self, logits: torch.Tensor, slots: Sequence[int], specs: Sequence[RunnerSampling]
    ) -> torch.Tensor:
        """The token of each row of ``logits`` [R, vocab] (float32, on the device), row r for
        ``slots[r]`` with ``specs[r]`` -> [R] int64 on the device."""
        out = argmax_rows(logits)  # the greedy rows' answer; seeded rows overwrite it
        seeded = [r for r, spec in enumerate(specs) if spec.temperature > 0.0]
        if seeded:
            rows = torch.tensor(seeded, device=logits.device)
            chosen = [specs[r] for r in seeded]
            probs, ids = sorted_probs(logits.index_select(0, rows), chosen)
            uniforms = torch.cat([self._uniform(slots[r], specs[r]) for r in seeded])
            out[rows] = draw_sorted(probs, ids, uniforms)
        return out

    def release(self, slot: int) -> None:
        self._streams.pop(slot, None)

    def _uniform(self, slot: int, spec: RunnerSampling) -> torch.Tensor:
        """One float64 uniform in [0, 1) from the slot's generator: [1] on the device."""
        held = self._streams.get(slot)
        if held is None or held.stream != spec.stream:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(spec.seed)
            held = self._streams[slot] = _Stream(spec.stream, generator)
        return torch.rand(1, generator=held.generator, dtype=torch.float64, device=self.device)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """[R, vocab] -> [R] int64: the first index of each row's maximum. On a CPU numpy's argmax
    (the host sampler's own) on the tensor's memory: torch's CPU reduction took 64 us for a
    49,152-entry row here against numpy's 3 us."""
    if logits.device.type == "cpu":
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return torch.argmax(logits, dim=-1)


def sorted_probs(
    logits: torch.Tensor, specs: Sequence[RunnerSampling]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's sampling distribution, in its tokens' order by scaled logit (descending, the
    lower id first on ties): probabilities [R, vocab] float64 (summing to 1, the cut tokens 0)
    and the token ids [R, vocab] int64 in that order. ``specs`` are seeded (temperature > 0)."""
    dev, n = logits.device, logits.shape[-1]

    def column(values: list[float], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=dev)[:, None]  # [R, 1]

    temperature = column([s.temperature for s in specs], torch.float32)
    scaled = logits / temperature
    # A temperature so small that a row's scaled logits overflow: its limit, the argmax, as
    # on the host (the engine keeps such requests there, so this is only the definition's edge).
    overflow = ~torch.isfinite(scaled.max(dim=-1, keepdim=True).values)
    scaled = torch.where(overflow, logits, scaled)
    values, ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    position = torch.arange(n, device=dev)[None, :]  # [1, vocab]
    # top-k: every token at least the k-th largest (ties with it too); k = 0 or >= vocab: all.
    k = column([s.top_k if 0 < s.top_k < n else n for s in specs], torch.int64)
    kth = values.gather(1, k - 1)
    kept = values >= kth
    weights = torch.exp((values - values[:, :1]).double())  # the maximum's is exactly 1
    probs = torch.where(kept, weights, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    min_p = column([s.min_p for s in specs], torch.float64)
    probs = torch.where(probs < min_p * probs[:, :1], 0.0, probs)
    # top-p: the shortest head whose mass reaches top_p of the total (at least one token).
    cum = probs.cumsum(dim=-1)
    top_p = column([s.top_p for s in specs], torch.float64)
    head = torch.searchsorted(cum, top_p * cum[:, -1:]) + 1  # [R, 1]
    head = torch.where(top_p < 1.0, head, n)
    probs = torch.where(position < head, probs, 0.0)
    probs = torch.where(overflow & (position > 0), 0.0, probs)  # the argmax alone
    return probs / probs.sum(dim=-1, keepdim=True), ids


def draw_sorted(probs: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row by inverse CDF over ``sorted_probs``' order: ``uniforms`` [R] float64
    in [0, 1) -> [R] int64 token ids."""
    cum = probs.cumsum(dim=-1)
    target = uniforms[:, None] * cum[:, -1:]
    pos = torch.searchsorted(cum, target, right=True)  # [R, 1]
    # Past the end (the float edge of the sum): the last token with mass, which the kept tokens
    # being a prefix of the row makes the count of nonzeros minus one.
    last = (probs > 0).sum(dim=-1, keepdim=True) - 1
    return ids.gather(1, torch.minimum(pos, last))[:, 0]
