"""Drawing tokens inside the llama.cpp runner, reading the context's logits in place, so no
vocabulary-sized row is copied out of llama.cpp's buffer.

Greedy is numpy's argmax on a view of the row (the first index on ties, as the host's). A drawn
token comes from one llama.cpp sampler chain per slot (``llama_sampler_sample``). That chain
builds a candidate entry per vocabulary id on every call, so on a CPU it costs more than the
host's sampler (docs/measurements.md has the figures): the runner says so
(``seeded_in_runner``) and the engine keeps seeded requests on the host.

The chain is built in the order of the engine's host sampler (engine/sampler.py): temperature,
top-k, min-p, top-p, then one draw from the softmax of what is left. llama.cpp's min-p keeps
``logit >= max + log(min_p)``, that is ``p >= min_p * p_max`` as the host does, and its top-p
renormalises what min-p left and keeps the shortest head reaching ``top_p``, as the host does;
tests/test_llamacpp_sampling.py compares the two distributions. Its generator is llama.cpp's
own (a 32-bit seed), so a seeded request draws the same distribution as on the host, not the
same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from localinfer.backends.llamacpp.output_rows import output_row_view
from localinfer.backends.runner_sampling import RunnerSampling


@dataclass(slots=True)
class _Chain:
    spec: RunnerSampling
    pointer: object  # llama_sampler *


class SlotSamplers:
    """A sampler chain per slot, rebuilt when a new request (``RunnerSampling.stream``) or new
    parameters arrive, freed on release and close."""

    def __init__(self, llama: ModuleType, vocab: int) -> None:
        self._llama = llama
        self._vocab = vocab
        self._chains: dict[int, _Chain] = {}

    def sample(self, ctx: object, slot: int, spec: RunnerSampling, row: int) -> int:
        """The token drawn for ``slot`` from the logits of output row ``row`` of the last decode."""
        if spec.temperature == 0.0:
            pointer = self._llama.llama_get_logits_ith(ctx, row)
            return int(output_row_view(pointer, self._vocab, "logits", row).argmax())
        chain = self._chains.get(slot)
        if chain is None or chain.spec != spec:
            self.release(slot)
            chain = self._chains[slot] = _Chain(spec, self._build(spec))
        # Also accepts the token into the chain (its generator and nothing else keeps state).
        return int(self._llama.llama_sampler_sample(chain.pointer, ctx, row))

    def release(self, slot: int) -> None:
        chain = self._chains.pop(slot, None)
        if chain is not None:
            self._llama.llama_sampler_free(chain.pointer)

    def close(self) -> None:
        for slot in list(self._chains):
            self.release(slot)

    def _build(self, spec: RunnerSampling) -> object:
        llama = self._llama
        params = llama.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = llama.llama_sampler_chain_init(params)
        if not chain:
            raise RuntimeError("llama.cpp could not make a sampler chain")
        parts = [llama.llama_sampler_init_temp(spec.temperature)]
        if spec.top_k > 0:
            parts.append(llama.llama_sampler_init_top_k(spec.top_k))
        if spec.min_p > 0.0:
            parts.append(llama.llama_sampler_init_min_p(spec.min_p, 1))
        if spec.top_p < 1.0:
            parts.append(llama.llama_sampler_init_top_p(spec.top_p, 1))
        parts.append(llama.llama_sampler_init_dist(spec.seed))
        for part in parts:
            llama.llama_sampler_chain_add(chain, part)  # the chain owns and frees it
        return chain
