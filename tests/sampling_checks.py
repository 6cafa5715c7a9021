"""One check for a runner's seeded draws against the host sampler's exact distribution, shared by
the llama.cpp and torch runner-sampling tests."""

from __future__ import annotations

import numpy as np


def assert_draws_follow(counts: np.ndarray, probs: np.ndarray, draws: int) -> None:
    """``counts`` (draws per token id) came from ``probs``: never a token the host excludes, and
    Pearson's chi-square over the tokens expected 5+ times (the rest pooled) far below what a
    wrong sampler scores. Seeds are fixed, so the outcome is the same on every run."""
    # Never a token the host's distribution excludes (top-k, min-p and top-p cut the same set).
    assert counts[probs == 0].sum() == 0
    # A wrong order of the cuts or temperature applied after them moves the statistic far past
    # this bound (p < 1e-6 for 20 cells).
    expected = probs * draws
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    keep = wanted > 0
    chi2 = float((((observed - wanted) ** 2)[keep] / wanted[keep]).sum())
    cells = int(keep.sum())
    assert cells >= 3, cells
    assert chi2 < cells + 6 * np.sqrt(2 * cells), (chi2, cells)
    # Total variation, for the reader: a few hundredths at these draw counts.
    assert 0.5 * np.abs(counts / draws - probs).sum() < 0.1
