"""Teacher-forced comparison metrics over logits (numpy only: any runner's output works)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[N, vocab] -> [N, vocab] float64 log-probabilities."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass(slots=True)
class MetricSums:
    """Running sums over scored positions; ``add`` per chunk, read the means at the end."""

    tokens: int = 0
    nll: float = 0.0  # sum of -log p(actual next token)
    kl: float = 0.0  # sum of KL(reference || candidate)
    agree: int = 0  # positions whose argmax matches the reference's
    compared: int = 0  # positions with a reference

    def add(
        self, logprobs: np.ndarray, targets: np.ndarray, ref_logprobs: np.ndarray | None = None
    ) -> None:
        """logprobs [N, vocab] of positions whose next tokens are targets [N]."""
        n = targets.shape[0]
        self.tokens += n
        self.nll += float(-logprobs[np.arange(n), targets].sum())
        if ref_logprobs is not None:
            p = np.exp(ref_logprobs)
            self.kl += float((p * (ref_logprobs - logprobs)).sum())
            self.agree += int((ref_logprobs.argmax(-1) == logprobs.argmax(-1)).sum())
            self.compared += n

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.nll / self.tokens)) if self.tokens else float("nan")

    @property
    def mean_kl(self) -> float:
        return self.kl / self.compared if self.compared else float("nan")

    @property
    def top1_agreement(self) -> float:
        return self.agree / self.compared if self.compared else float("nan")
