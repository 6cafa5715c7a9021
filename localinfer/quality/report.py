"""Quality rows, the thresholds that trigger a warning, and the table ``localinfer quality``
prints."""

from __future__ import annotations

from dataclasses import dataclass, field

# Loss past any of these gets a warning line. A 2% perplexity rise is what int8 should stay
# under; past 5% (or these KL / agreement figures) a user will notice answers changing.
PPL_INCREASE_WARN = 0.05
KL_WARN = 0.05  # nats per token
TOP1_WARN = 0.90


@dataclass(slots=True, frozen=True)
class QualityRow:
    backend: str
    quant: str  # what the runner reports (RunnerInfo.quant)
    perplexity: float
    kl: float  # mean KL(reference || this) per token; 0 for the reference
    top1: float  # fraction of positions whose argmax matches the reference's
    weights_bytes: int  # measured (Runner.memory().weights)
    budget_bytes: int | None  # the budget's prediction for the same quantization
    decode_tok_s: float | None  # single stream, greedy
    reference: bool = False
    # The reference's perplexity on the tokens this row was scored on, where they are fewer
    # than the table's (mlx[cpu] rows by default: run.py); None: the reference row's.
    reference_perplexity: float | None = None

    def perplexity_rise(self, reference: QualityRow) -> float:
        return self.perplexity / (self.reference_perplexity or reference.perplexity) - 1

    @property
    def budget_error(self) -> float | None:
        if not self.budget_bytes:
            return None
        return self.weights_bytes / self.budget_bytes - 1


@dataclass(slots=True)
class QualityReport:
    model: str
    tokens: int  # scored positions
    rows: list[QualityRow]
    notes: list[str] = field(default_factory=list)  # candidates left out, and why

    @property
    def reference(self) -> QualityRow:
        return next(r for r in self.rows if r.reference)

    def warnings(self) -> list[str]:
        ref = self.reference
        out = []
        for r in self.rows:
            if r.reference:
                continue
            rise = r.perplexity_rise(ref)
            reasons = []
            if rise > PPL_INCREASE_WARN:
                reasons.append(f"perplexity +{rise:.1%}")
            if r.kl > KL_WARN:
                reasons.append(f"KL {r.kl:.3f}")
            if r.top1 < TOP1_WARN:
                reasons.append(f"top-1 agreement {r.top1:.1%}")
            if reasons:
                out.append(
                    f"WARNING: {r.backend} {r.quant} loses noticeable quality "
                    f"({', '.join(reasons)}; thresholds: perplexity +{PPL_INCREASE_WARN:.0%}, "
                    f"KL {KL_WARN}, top-1 {TOP1_WARN:.0%})"
                )
        return out

    def render(self) -> str:
        ref = self.reference
        head = (
            f"{'backend':<9} {'quant':<10} {'ppl':>8} {'Δppl':>7} {'KL':>7} {'top-1':>7} "
            f"{'weights':>9} {'budget':>9} {'Δ':>6} {'tok/s':>7}"
        )
        lines = [f"{self.model}: {self.tokens} tokens of the evaluation text", head]
        for r in self.rows:
            rise = r.perplexity_rise(ref)
            err = r.budget_error
            lines.append(
                f"{r.backend:<9} {r.quant + (' (ref)' if r.reference else ''):<10} "
                f"{r.perplexity:>8.3f} {rise:>+7.1%} {r.kl:>7.4f} {r.top1:>7.1%} "
                f"{_mb(r.weights_bytes):>9} {_mb(r.budget_bytes):>9} "
                f"{'' if err is None else f'{err:+.1%}':>6} "
                f"{'' if r.decode_tok_s is None else f'{r.decode_tok_s:.1f}':>7}"
            )
        return "\n".join(lines + self.notes + self.warnings())


def _mb(n: int | None) -> str:
    return "" if n is None else f"{n / 1e6:.1f}MB"
