"""Verification: decide which proposed tokens the target model keeps, from one forward's logits.

The target forward fed ``[last, x1, ..., xk]`` with ``logits="all"``, so row i of its logits is
the target's next-token distribution after ``x1..xi``.

- Greedy requests: row by row, the target's own choice (``TokenSampler.sample``: penalties and
  argmax, exactly as plain decoding) is emitted; while it equals the proposal the next row is
  valid too. So the output is token-identical to decoding without speculation, and at least one
  token (the target's own) comes out of every verification.
- Sampled requests (Leviathan et al. / Chen et al.): x_i is kept with probability
  min(1, p(x_i)/q(x_i)); at the first rejection one token is drawn from normalised
  max(p - q, 0) and verification stops; if all k pass, one bonus token is drawn from row k.
  The emitted tokens are then distributed exactly as the target's own sampling. A point-mass
  proposal (n-gram, greedy draft) has q(x_i) = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localinfer.engine.sampler import SampledToken, TokenSampler
from localinfer.engine.speculative.distribution import draw, target_probs
from localinfer.engine.speculative.proposal import Proposal


@dataclass(slots=True, frozen=True)
class Verdict:
    """The tokens to emit (accepted proposals, then the target's correction or bonus token)."""

    tokens: tuple[SampledToken, ...]
    accepted: int  # how many proposals were kept (len(tokens) - 1)


def verify(
    sampler: TokenSampler,
    proposal: Proposal,
    logits: np.ndarray,
    rng: np.random.Generator | None = None,
) -> Verdict:
    """Accept a prefix of ``proposal`` against target ``logits`` [k + 1, vocab].

    Every emitted token is observed by ``sampler`` (penalty counts advance exactly as in plain
    decoding). ``rng`` draws the acceptance coins and residual samples of sampled requests
    (default: the sampler's own generator, so a seeded request stays reproducible).
    """
    if logits.ndim != 2 or logits.shape[0] != proposal.k + 1:
        raise ValueError(f"need {proposal.k + 1} logits rows, got shape {logits.shape}")
    if sampler.params.greedy:
        return _verify_greedy(sampler, proposal, logits)
    return _verify_sampled(sampler, proposal, logits, rng or sampler.rng)


def _verify_greedy(sampler: TokenSampler, proposal: Proposal, logits: np.ndarray) -> Verdict:
    out: list[SampledToken] = []
    for i, proposed in enumerate(proposal.tokens):
        token = sampler.sample(logits[i])
        out.append(token)
        if token.token_id != proposed:
            return Verdict(tuple(out), accepted=i)
    out.append(sampler.sample(logits[proposal.k]))
    return Verdict(tuple(out), accepted=proposal.k)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The distribution to resample from after a rejection: normalised max(p - q, 0)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    # p == q leaves nothing (and then a rejection has probability 0): fall back to p.
    return r / total if total > 0.0 else p


def _verify_sampled(
    sampler: TokenSampler, proposal: Proposal, logits: np.ndarray, rng: np.random.Generator
) -> Verdict:
    out: list[SampledToken] = []
    for i, x in enumerate(proposal.tokens):
        p = target_probs(sampler, logits[i])  # [vocab], with penalties of the tokens so far
        if proposal.q is None:
            q = np.zeros_like(p)
            q[x] = 1.0
        else:
            q = proposal.q[i]
        qx = q[x]
        if qx > 0.0 and rng.random() * qx < p[x]:  # u < p/q, without dividing by a tiny q
            out.append(_emit(sampler, logits[i], x))
            continue
        out.append(_emit(sampler, logits[i], draw(residual(p, q), rng)))
        return Verdict(tuple(out), accepted=i)
    p = target_probs(sampler, logits[proposal.k])
    out.append(_emit(sampler, logits[proposal.k], draw(p, rng)))
    return Verdict(tuple(out), accepted=proposal.k)


def _emit(sampler: TokenSampler, logits_row: np.ndarray, token: int) -> SampledToken:
    raw = np.asarray(logits_row, dtype=np.float32).reshape(-1)[: sampler.vocab_size]
    logprob, top = sampler.logprobs(raw, token)  # same logprobs as plain decode
    sampler.observe(token)
    return SampledToken(token_id=token, logprob=logprob, top=top)
