"""`localinfer budget --verify`: load the model with the real runner at the budgeted settings, run
one prefill chunk (at the end of the context where the runner can be filled cheaply), and put the
runner's measured memory next to the prediction (budget.report.MemoryCheck). With a projector
counted (--mmproj) the runner loads it, and one image of its size is prompted, encoded and fed.

It builds a runner through the session, so it stands above the session with ``quality``, not in
the budget (docs/layers.md)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.backends.base import Runner, SlotWork, SyntheticFill
from localinfer.budget.measured import process_rss
from localinfer.budget.memory import cpu_memory, human_bytes
from localinfer.budget.report import BudgetReport, MemoryCheck
from localinfer.engine.images import IMAGE_MARKER, RGBImage, runner_vision
from localinfer.errors import InvalidParameterError, ModelFileError

if TYPE_CHECKING:
    from localinfer.loading.model import LoadedModel

log = logging.getLogger(__name__)


# The module each backend's runtime constant is the import of.
_LIBRARY = {"torch": "torch", "llamacpp": "llama_cpp", "mlx": "mlx.core"}


def verify_budget(
    report: BudgetReport, dtype: str | None = None, threads: int | None = None
) -> MemoryCheck:
    """Build the runner the report budgets for and measure it. Needs the model on disk.

    The measurement is what a session would hold: the model's tokenizer and the runner, after
    one full prefill chunk into slot 0 asking for its last row's logits, as the engine's prefill
    does. For a figure comparable with the predicted total run it in a fresh process
    (scripts/budget-accuracy does, one per cell): RSS is read before the model and the backend
    library load.
    """
    if report.model_path is None:
        raise ModelFileError(
            report.model, f"--verify needs the model on disk; run `localinfer pull {report.model}`"
        )
    device = report.device
    if device not in ("cpu", "metal") and not device.startswith("cuda"):
        raise InvalidParameterError("--verify measures this machine; drop --device SIZE")
    if not report.fits:
        # Building it would allocate past the free memory: an allocator error at best, the OOM
        # killer (or a swapping machine) at worst. A fitting setting checks the same formulas.
        need, have = human_bytes(report.total_bytes), human_bytes(report.available_bytes)
        raise InvalidParameterError(
            f"--verify loads the model, and this budget does not fit ({need} of {have}); "
            "verify a setting that fits"
        )
    preloaded = _LIBRARY.get(report.backend, "") in sys.modules
    before = process_rss()
    # The loaded model stays referenced while RSS is read: a session keeps its tokenizer (a
    # 262k vocabulary's tables are ~130 MiB), and the budget's runtime row counts it.
    model, runner = _budgeted_runner(report, dtype, threads)
    try:
        # One full prefill chunk, so compute buffers reach the size the budget counts: the
        # context's last, where a runner can be filled up to it cheaply, so its attention spans
        # every cell (llama.cpp without flash attention holds chunk x heads x cells of scores).
        n = min(report.prefill_chunk, report.ctx)
        start = _deep_start(runner, report, n)
        # What loading freed (the tokenizer's build, the fill's host copies) but glibc keeps:
        # not held by the model, and reused by whatever the process allocates next.
        _return_free_heap()
        vocab = runner.info.vocab_size
        tokens = tuple(1 + i % (vocab - 1) for i in range(n))
        runner.forward([SlotWork(slot=0, tokens=tokens, start_pos=start, logits="last")])
        measured = runner.memory()
        projector = _projector_growth(runner, report)
        after = process_rss()
    finally:
        runner.close()
        del model
    growth = (
        after - before if device == "cpu" and after is not None and before is not None else None
    )
    vision = report.vision  # the projector's figures: its encoder's host parts get their own row
    host_encoder = vision.compute_bytes - vision.graph_bytes if vision else 0
    return MemoryCheck(
        backend=report.backend,
        device=device,
        predicted_weights=report.weights_bytes,
        measured_weights=measured.weights,
        predicted_kv_cache=report.kv_cache_bytes,
        measured_kv_cache=measured.kv_cache,
        predicted_compute=report.compute_bytes - host_encoder,  # its graph: in mtmd's log
        measured_overhead=measured.overhead,
        predicted_total=report.total_bytes,
        rss_growth=growth,
        library_preloaded=preloaded,
        predicted_projector=vision.projector_bytes + vision.compute_bytes if vision else None,
        measured_projector=projector if device == "cpu" else None,
    )


def _projector_growth(runner: Runner, report: BudgetReport) -> int | None:
    """With a projector counted: the process's growth while the runner loaded it, plus while one
    image of its size was prompted and encoded; then the image is fed to slot 0 (its filled
    cells released first) for the total's figure. None when the growth was not read."""
    vision = runner_vision(runner)
    if report.vision is None or vision is None:
        return None
    size = report.vision.image_size
    image = RGBImage(size, size, random.Random(0).randbytes(size * size * 3))
    _return_free_heap()
    before = process_rss()
    prompt = vision.prompt(IMAGE_MARKER, [image], None)
    vision.encode(prompt.images[0])  # kept: the forward below reuses it
    _return_free_heap()
    after, loaded = process_rss(), vision.load_growth()
    if len(prompt.ids) <= report.ctx:  # its tokens are KV cells like any others
        runner.release(0)
        runner.forward([SlotWork(0, tuple(prompt.ids), 0, images=prompt.images)])
    if before is None or after is None or loaded is None:
        return None
    return loaded + after - before


def _deep_start(runner: Runner, report: BudgetReport, chunk: int) -> int:
    """Fill slot 0 up to the context's last chunk where the runner can do that cheaply and the
    fill's host copies (about three times those cells' KV bytes) fit in free memory; the
    position the measured chunk then starts at (0 where the runner was not filled)."""
    start = report.ctx - chunk
    if not isinstance(runner, SyntheticFill) or start <= 0:
        return 0
    copies = 3 * report.kv_cache_bytes // max(1, report.concurrency) * start // report.ctx
    if copies > cpu_memory()[0] // 2:
        log.info("budget --verify: measuring at the start of the context (no memory to fill it)")
        return 0
    try:
        runner.fill_synthetic(0, start)
    except (RuntimeError, ValueError, NotImplementedError, MemoryError) as exc:
        log.info("budget --verify: measuring at the start of the context (%s)", exc)
        runner.release(0)
        return 0
    return start


def _return_free_heap() -> None:
    """glibc keeps freed small blocks in its heap; hand them back so RSS shows what is held."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def _budgeted_runner(
    report: BudgetReport, dtype: str | None, threads: int | None = None
) -> tuple[LoadedModel, Runner]:
    """The model opened as a session opens it, and its runner at the report's settings
    (verify_budget asks only for one that fits; force skips the session's own budget check,
    which would repeat it). The dtype defaults to the one the budget assumed (the backend's
    default on the device, as in a session)."""
    assert report.model_path is not None
    # backend, ctx, slots, dtype, KV type: the report's
    # Imported here, after the first RSS reading: the session's modules (engine, loaders) are
    # part of what the runtime constant measures, as when a session starts in a fresh process.
    from localinfer.session import RunnerSettings, build_runner, open_model

    # The cache type as budgeted (the backend's own unless --kv-dtype named another).
    settings = RunnerSettings(
        report.backend,
        report.ctx,
        report.concurrency,
        dtype,
        threads=threads,
        device=report.device,
        force=True,
        kv_dtype=report.kv_dtype,
        # the projector the budget counted, beside the model; else none (not one found there)
        mmproj=str(Path(report.model_path).parent / report.mmproj) if report.mmproj else "none",
    )
    model = open_model(report.model_path).model
    return model, build_runner(model, settings).runner
