"""Per-slot choice of k from the running acceptance rate.

Model: each proposed token is accepted with probability a (given the ones before it were), so a
verification of k proposals yields E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens,
and costs 1 + fixed + k * (verify_cost + draft_cost) decode steps (config.py). k is the argmax of
E(k) / cost(k) over 0..k_max; k = 0 (plain decoding) wins when acceptance is too low to pay for
the extra work.

The acceptance estimate a is a decayed ratio: after a verification with m proposals of which
j were accepted, j successes and (1 if j < m) failures are added (the maximum-likelihood estimate
of a geometric run), old evidence fading by ``decay``. A new request starts from a prior
(``prior_acceptance``, weighted like ``PRIOR_WEIGHT`` proposals), so its first verification
tries the k that acceptance would pay for, and a text that copies its prompt speculates from its
first few tokens.

A paused slot (k = 0) probes now and then, so it notices when the text turns predictable again
(say, the answer starts quoting the prompt), unless the costs are such that even the prior's
acceptance would not pay (a draft model measured nearly as slow as the target). A probe
proposes the prior's k, not 1: on a backend whose multi-token forward has a fixed cost (llama.cpp
on a CPU) one extra token can never pay, so a k = 1 probe would be pure loss. A fully accepted
probe restarts the estimate from the prior (the text has changed regime); a failed one doubles
the wait before the next, up to ``MAX_PROBE_BACKOFF`` times ``probe_every``, which bounds what
probing costs on free text.
"""

from __future__ import annotations

from localinfer.engine.speculative.config import SpecConfig


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verification of ``k`` proposals yields at per-token acceptance ``a``."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(
    a: float, k_max: int, step_cost: float, fixed_cost: float = 0.0, min_gain: float = 1.0
) -> int:
    """The k in 0..k_max with the most expected tokens per unit of cost (k = 0 costs 1); a k > 0
    must beat plain decoding by ``min_gain``, a margin for a cost model that is only measured."""
    best, best_rate = 0, 1.0
    for k in range(1, k_max + 1):
        rate = expected_tokens(a, k) / (1.0 + fixed_cost + k * step_cost)
        if rate > best_rate + 1e-12 and rate >= min_gain:
            best, best_rate = k, rate
    return best


PRIOR_WEIGHT = 4.0  # the prior counts like this many proposals of evidence
MAX_PROBE_BACKOFF = 8


class AdaptiveK:
    """The k controller of one slot (reset when a new request takes the slot).

    ``config`` gives k_max, the prior, the decay (``ema_decay``), ``probe_every``, the fixed cost
    (``verify_fixed``) and ``min_gain``; ``step_cost`` (verification plus draft, per proposed
    token) changes as the speculator measures a draft model.
    """

    def __init__(self, config: SpecConfig, step_cost: float) -> None:
        self.config = config
        self.step_cost = step_cost
        self.probing = False  # the k last returned is a probe of a paused slot
        self.pinned = False  # step_cost stays as configured (a seeded sampled request)
        self._verified = 0  # verifications seen by this controller
        self._paused_steps = 0
        self._probe_interval = config.probe_every
        self._hits = self._tries = 0.0
        self._restart()

    def _best_k(self, acceptance: float) -> int:
        c = self.config
        return best_k(acceptance, c.k_max, self.step_cost, c.verify_fixed, c.min_gain)

    def _restart(self) -> None:
        self._hits = self.config.prior_acceptance * PRIOR_WEIGHT
        self._tries = PRIOR_WEIGHT

    @property
    def probe_k(self) -> int:
        """What a probe proposes: the k the prior would pay for at today's costs (step_cost
        changes as the speculator measures a draft model). 0: not even the prior's acceptance
        pays at these costs (a draft measured nearly as slow as the target), so probing could
        only lose; the slot decodes plainly until the costs change."""
        return self._best_k(self.config.prior_acceptance)

    @property
    def acceptance(self) -> float:
        return self._hits / self._tries if self._tries > 0 else 0.0

    def next_k(self) -> int:
        """k for this step (0: decode plainly). Call once per decode step of the slot."""
        k = self._best_k(self.acceptance)
        self.probing = False
        if k > 0:
            self._paused_steps = 0
            self._probe_interval = self.config.probe_every
            return k
        self._paused_steps += 1
        if self._paused_steps >= self._probe_interval:
            k = self.probe_k
            self.probing = k > 0
            return k
        return 0

    @property
    def tentative(self) -> bool:
        """This step's k rests on no evidence of this request's own: a probe, or the prior."""
        return self.probing or self._verified == 0

    def defer_probe(self) -> None:
        """The probe found nothing worth verifying: try again next step, at no cost."""
        self.probing = False

    def update(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted {accepted} of {proposed}")
        self._verified += 1
        if self.probing:
            self.probing = False
            self._paused_steps = 0
            if accepted == proposed:
                self._restart()
                self._probe_interval = self.config.probe_every
            else:
                self._probe_interval = min(
                    self._probe_interval * 2, self.config.probe_every * MAX_PROBE_BACKOFF
                )
        decay = self.config.ema_decay
        self._hits = decay * self._hits + accepted
        self._tries = decay * self._tries + accepted + (1 if accepted < proposed else 0)
