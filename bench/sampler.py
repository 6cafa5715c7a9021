"""Per-token sampling cost: the engine's sampler against the full-sort definition.

For each vocabulary size (49,152: SmolLM2; 151,936: Qwen; 262,144: Gemma 3) and each setting
(greedy; temperature 0.7; with top-p 0.95, top-k 40 or min-p 0.05), with and without penalties
(repetition 1.1, presence 0.3, frequency 0.3 over a 1,000-token prompt and the tokens drawn so
far), it times one :meth:`TokenSampler.sample` call per logits row (what the engine does per
token, logprobs off) against the same step done the full-sort way: penalties through
vocabulary-sized seen/count arrays, ``exact_sampling_probs`` and an inverse CDF over every id.
It prints milliseconds per token (median) and old/new.

The logits are shaped like a language model's next-token distribution (log-probabilities
falling as a power of the rank, ids shuffled, a little noise); ``--shape flat`` uses Gaussian
logits instead, the worst case for top-p (its nucleus is a large share of the vocabulary).

    scripts/bench-sampler
    scripts/bench-sampler --vocabs 151936 --calls 400 --shape flat
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localinfer.engine.sampler import TokenSampler, exact_sampling_probs
from localinfer.engine.types import SamplingParams

VOCABS = (49_152, 151_936, 262_144)
SETTINGS: dict[str, dict[str, float | int]] = {
    "greedy": {},
    "temperature 0.7": {"temperature": 0.7},
    "t0.7 + top_p 0.95": {"temperature": 0.7, "top_p": 0.95},
    "t0.7 + top_k 40": {"temperature": 0.7, "top_k": 40},
    "t0.7 + min_p 0.05": {"temperature": 0.7, "min_p": 0.05},
}
PENALTIES = {"repetition_penalty": 1.1, "presence_penalty": 0.3, "frequency_penalty": 0.3}
PROMPT_TOKENS = 1000
ROWS = 16  # distinct logits rows, cycled
TARGET_MS = 0.5  # at the largest vocabulary with top-p 0.95


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-sampler", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocabs", default=",".join(map(str, VOCABS)), help="comma-separated sizes")
    p.add_argument("--calls", type=int, default=200, help="timed calls per row, new sampler")
    p.add_argument("--old-calls", type=int, default=12, help="timed calls per row, full sort")
    p.add_argument("--shape", choices=("lm", "flat"), default="lm", help="logits shape")
    return p.parse_args()


def logits_rows(vocab: int, shape: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(ROWS):
        if shape == "flat":
            row = rng.standard_normal(vocab) * 2.5
        else:
            # Zipf-like: log p(rank r) ~ -s ln r, s drawn per row (peaked to broad), shuffled.
            s = rng.uniform(0.9, 1.6)
            ranks = np.arange(1, vocab + 1, dtype=np.float64)
            row = rng.permutation(-s * np.log(ranks) + rng.normal(0.0, 0.3, vocab)) + 8.0
        rows.append(row.astype(np.float32))
    return rows


class FullSortSampler:
    """The per-token step the full-sort way, with the same seed and penalties."""

    def __init__(self, params: SamplingParams, vocab: int, prompt: np.ndarray) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.seen = np.zeros(vocab, dtype=bool)
        self.counts = np.zeros(vocab, dtype=np.int32)
        if params.repetition_penalty != 1.0:
            self.seen[prompt] = True

    def sample(self, raw: np.ndarray) -> int:
        p = self.params
        if not np.isfinite(raw).any():
            raise ValueError("no finite logits")
        x = raw
        if p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
            x = raw.copy()
            idx = np.flatnonzero(self.seen)
            vals = x[idx]
            x[idx] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            idx = np.flatnonzero(self.counts)
            x[idx] -= p.presence_penalty + p.frequency_penalty * self.counts[idx]
        if p.greedy:
            token = int(np.argmax(x))
        else:
            probs = exact_sampling_probs(p, x)
            cum = np.cumsum(probs)
            token = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
            if token >= probs.shape[0] or probs[token] == 0.0:
                token = int(np.flatnonzero(probs)[-1])
        self.seen[token] = True
        self.counts[token] += 1
        return token


def median_ms(step: Callable[[np.ndarray], object], rows: list[np.ndarray], calls: int) -> float:
    times = []
    for i in range(calls):
        row = rows[i % len(rows)]
        start = time.perf_counter()
        step(row)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@dataclass(frozen=True, slots=True)
class Row:
    vocab: int
    setting: str
    penalties: bool
    new_ms: float
    old_ms: float


def measure(vocab: int, shape: str, calls: int, old_calls: int) -> list[Row]:
    rows = logits_rows(vocab, shape)
    prompt = np.random.default_rng(1).integers(0, vocab, PROMPT_TOKENS)
    out = []
    for name, setting in SETTINGS.items():
        for penalties in (False, True):
            params = SamplingParams(seed=0, **setting, **(PENALTIES if penalties else {}))
            new = TokenSampler(params, vocab, prompt.tolist())
            old = FullSortSampler(params, vocab, prompt)
            median_ms(new.sample, rows, 8)  # warm-up: first-call costs out of the figures
            median_ms(old.sample, rows, 2)
            out.append(
                Row(
                    vocab,
                    name,
                    penalties,
                    median_ms(new.sample, rows, calls),
                    median_ms(old.sample, rows, old_calls),
                )
            )
    return out


def main() -> None:
    args = parse_args()
    vocabs = [int(v) for v in args.vocabs.split(",") if v]
    print(f"logits: {args.shape}; ms per token, median; old = full-sort definition")
    print(
        f"{'vocab':>8}  {'setting':<20} {'penalties':<9} {'new ms':>8} {'old ms':>8} {'old/new':>8}"
    )
    results = []
    for vocab in vocabs:
        for r in measure(vocab, args.shape, args.calls, args.old_calls):
            results.append(r)
            pen = "yes" if r.penalties else "no"
            ratio = r.old_ms / r.new_ms if r.new_ms > 0 else float("inf")
            print(
                f"{r.vocab:>8}  {r.setting:<20} {pen:<9} {r.new_ms:>8.3f} {r.old_ms:>8.3f}"
                f" {ratio:>7.1f}x",
                flush=True,
            )
    largest = max(vocabs)
    top_p = [r for r in results if r.vocab == largest and "top_p" in r.setting]
    for r in top_p:
        verdict = "meets" if r.new_ms <= TARGET_MS else "misses"
        pen = "with" if r.penalties else "without"
        print(
            f"top_p 0.95 at {largest}, {pen} penalties: {r.new_ms:.3f} ms/token, {verdict}"
            f" the {TARGET_MS} ms target"
        )


if __name__ == "__main__":
    main()
