"""Build the reference and the quantized runners of one model and measure them together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localinfer import session
from localinfer.backends.base import Runner
from localinfer.errors import LocalinferError
from localinfer.loading.model import LoadedModel
from localinfer.quality.evaluate import compare, decode_speed, eval_text, eval_windows
from localinfer.quality.gguf_files import quantized_model
from localinfer.quality.metrics import MetricSums
from localinfer.quality.report import QualityReport, QualityRow
from localinfer.session import RunnerSettings

SPEED_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@dataclass(slots=True, frozen=True)
class QualityOptions:
    quants: Sequence[str] = ("int8", "int4")
    backend: str = "torch"
    max_tokens: int | None = None  # None: the whole evaluation text
    window: int = 512  # tokens per scored window (each from a fresh cache)
    chunk: int = 128  # tokens per forward pass
    speed_steps: int = 32  # decode steps timed per runner; 0: skip
    threads: int | None = None
    text: str | None = None  # None: the shipped evaluation text
    slots: int = 1  # slots of every runner built (bench-quant times 8 streams)


def build_runner(
    model: LoadedModel, backend: str, quant: str | None, opts: QualityOptions
) -> Runner:
    """One runner of ``model`` at the evaluation's size, on the CPU in float32 like the
    reference. Built without the budget's check: every runner here holds one short window."""
    settings = RunnerSettings(
        backend=backend,
        ctx=max(opts.window, 64) + 64 + opts.speed_steps,
        slots=opts.slots,
        dtype="float32",
        quant=quant,
        threads=opts.threads,
        device="cpu",
        force=True,
    )
    return session.build_runner(model, settings).runner


def budget_weights(model: LoadedModel, quant: str | None, backend: str) -> int | None:
    """The budget's weight bytes for ``quant`` (None where it has no figure for it)."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget.compute import BudgetRequest
    from localinfer.errors import LocalinferError

    try:
        report = compute_budget(
            BudgetRequest(str(model.path), quant=quant or "f32", backend=backend, device="1TiB")
        )
    except LocalinferError:
        return None
    return report.weights_bytes


ALL_BACKENDS = ("torch", "llamacpp", "mlx")


@dataclass(slots=True)
class Candidate:
    runner: Runner
    model: LoadedModel  # what it runs: llama.cpp's is the re-quantized GGUF


def build_candidate(
    model: LoadedModel, backend: str, quant: str, opts: QualityOptions
) -> Candidate:
    """llama.cpp runs a GGUF as stored: its candidate is the file quantized into the quant cache
    (gguf_files.py); torch and MLX quantize while they load."""
    if backend == "llamacpp":
        gguf = quantized_model(model, quant, opts.threads)
        return Candidate(build_runner(gguf, backend, None, opts), gguf)
    return Candidate(build_runner(model, backend, quant, opts), model)


def build_candidates(model: LoadedModel, opts: QualityOptions, notes: list[str]) -> list[Candidate]:
    """One candidate per (backend, quant); with ``--backend all`` a backend this machine cannot
    run is left out with a note instead of failing the whole table."""
    every = opts.backend == "all"
    out: list[Candidate] = []
    for backend in ALL_BACKENDS if every else (opts.backend,):
        for q in opts.quants:
            try:
                out.append(build_candidate(model, backend, q, opts))
            except (LocalinferError, ImportError) as exc:
                if not every:
                    raise
                notes.append(f"{backend} {q}: not measured ({exc})")
    return out


# mlx[cpu] runs ~0.1 CPU-second a token on the embedded model (a reference BLAS and plain
# quantized kernels: a 128-token forward costs 128 decode steps), 50x torch's float32; scored on
# the whole text (2,758 tokens) two MLX rows took over 5 minutes. By default they score this
# many tokens, beside the reference on the same tokens, and the table says so.
SLOW_TOKENS = 256


def slow_here(runner: Runner) -> bool:
    """Scoring on this runner costs a decode step per token (MLX on the CPU)."""
    return runner.info.backend == "mlx" and runner.info.device == "cpu"


@dataclass(slots=True)
class Scored:
    sums: MetricSums  # the candidate's
    reference: MetricSums  # the reference's, on the same tokens


def score(
    reference: Runner, candidates: Sequence[Runner], ids: Sequence[int], opts: QualityOptions
) -> tuple[MetricSums, list[Scored], str | None]:
    """Every candidate against the reference on the first ``opts.max_tokens`` ids (None: all),
    except that without a ``max_tokens`` a slow candidate scores the first SLOW_TOKENS only.
    Returns the reference's sums on the table's tokens, each candidate's, and a note on the
    slow ones (None when there are none)."""
    short = opts.max_tokens is None and len(ids) > SLOW_TOKENS
    slow = [i for i, r in enumerate(candidates) if short and slow_here(r)]
    fast = [i for i in range(len(candidates)) if i not in slow]
    out: dict[int, Scored] = {}
    ref_sums: MetricSums | None = None
    if fast or not slow:
        windows = eval_windows(ids, opts.window, opts.max_tokens)
        ref_sums, sums = compare(reference, [candidates[i] for i in fast], windows, opts.chunk)
        out.update({i: Scored(s, ref_sums) for i, s in zip(fast, sums, strict=True)})
    note = None
    if slow:
        windows = eval_windows(ids, opts.window, SLOW_TOKENS)
        ref_short, sums = compare(reference, [candidates[i] for i in slow], windows, opts.chunk)
        out.update({i: Scored(s, ref_short) for i, s in zip(slow, sums, strict=True)})
        ref_sums = ref_sums or ref_short
        if fast:
            note = (
                f"mlx rows (on the CPU): the first {ref_short.tokens} tokens, against the "
                f"reference on the same tokens (ppl {ref_short.perplexity:.3f}); --tokens N "
                "scores every row on N"
            )
        else:
            note = f"mlx on the CPU: the first {ref_short.tokens} tokens; --tokens N for more"
    assert ref_sums is not None
    return ref_sums, [out[i] for i in range(len(candidates))], note


def measure_quality(model: LoadedModel, opts: QualityOptions) -> QualityReport:
    """Reference: the torch runner with the model dequantized to float32. One row each for the
    reference and every ``opts.quants`` entry on ``opts.backend`` (``all``: every backend)."""
    ids = model.tokenizer.encode(opts.text or eval_text(), add_special_tokens=True)
    reference = build_runner(model, "torch", "none", opts)
    notes: list[str] = []
    candidates: list[Candidate] = []
    try:
        candidates = build_candidates(model, opts, notes)
        ref_sums, scored, note = score(reference, [c.runner for c in candidates], ids, opts)
        notes += [note] if note else []
        prompt = model.tokenizer.encode(SPEED_PROMPT, add_special_tokens=True)

        def speed(r: Runner) -> float | None:
            if not opts.speed_steps:
                return None
            # One timed run, not the median of three, where a step costs a tenth of a second.
            repeats = 1 if slow_here(r) else 3
            return decode_speed(r, prompt, opts.speed_steps, repeats=repeats).tokens_per_s

        rows = [
            QualityRow(
                "torch", reference.info.quant, ref_sums.perplexity, 0.0, 1.0,
                reference.memory().weights, budget_weights(model, "f32", "torch"),
                speed(reference), reference=True,
            )
        ]  # fmt: skip
        for c, s in zip(candidates, scored, strict=True):
            r = c.runner
            rows.append(
                QualityRow(
                    r.info.backend, r.info.quant, s.sums.perplexity, s.sums.mean_kl,
                    s.sums.top1_agreement, r.memory().weights,
                    budget_weights(c.model, r.info.quant, r.info.backend), speed(r),
                    reference_perplexity=s.reference.perplexity,
                )
            )  # fmt: skip
        return QualityReport(model.name, ref_sums.tokens, rows, notes)
    finally:
        for r in [reference, *(c.runner for c in candidates)]:
            r.close()
