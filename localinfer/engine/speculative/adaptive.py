"""Per-slot choice of k from the running acceptance rate.

Model: each proposed token is accepted with probability a (given the ones before it were), so a
verification of k proposals yields E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens,
and costs 1 + k * (verify_cost + draft_cost) decode steps. k is the argmax of E(k) / cost(k) over
0..k_max; k = 0 (plain decoding) wins when acceptance is too low to pay for the extra work. A
paused slot probes with k = 1 every ``probe_every`` steps so it notices when the text turns
predictable again (say, the answer starts quoting the prompt).

The acceptance estimate a is a decayed ratio: after a verification with m proposals of which
j were accepted, j successes and (1 if j < m) failures are added (the maximum-likelihood estimate
of a geometric run), old evidence fading by ``decay``.
"""

from __future__ import annotations


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verification of ``k`` proposals yields at per-token acceptance ``a``."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(a: float, k_max: int, step_cost: float) -> int:
    """The k in 0..k_max with the most expected tokens per unit of cost."""
    best, best_rate = 0, 1.0
    for k in range(1, k_max + 1):
        rate = expected_tokens(a, k) / (1.0 + k * step_cost)
        if rate > best_rate + 1e-12:
            best, best_rate = k, rate
    return best


class AdaptiveK:
    """The k controller of one slot (reset when a new request takes the slot)."""

    def __init__(
        self,
        k_max: int = 8,
        k_start: int = 4,
        step_cost: float = 0.05,
        decay: float = 0.7,
        probe_every: int = 8,
    ) -> None:
        self.k_max = k_max
        self.step_cost = step_cost
        self.decay = decay
        self.probe_every = probe_every
        # Prior: as if k_start proposals had just been verified with one rejection at the end,
        # weighted like one observation, so early steps try k_start and then follow the data.
        self._hits = float(k_start - 1)
        self._tries = float(k_start)
        self._paused_steps = 0

    @property
    def acceptance(self) -> float:
        return self._hits / self._tries if self._tries > 0 else 0.0

    def next_k(self) -> int:
        """k for this step (0: decode plainly). Call once per decode step of the slot."""
        k = best_k(self.acceptance, self.k_max, self.step_cost)
        if k > 0:
            self._paused_steps = 0
            return k
        self._paused_steps += 1
        if self._paused_steps >= self.probe_every:
            self._paused_steps = 0
            return 1
        return 0

    def update(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted {accepted} of {proposed}")
        self._hits = self.decay * self._hits + accepted
        self._tries = self.decay * self._tries + accepted + (1 if accepted < proposed else 0)
