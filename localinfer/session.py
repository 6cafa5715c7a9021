"""The one road from a model's name to a running engine.

    name -> resolve -> load (headers, tokenizer) -> choose a backend -> budget (refuse or go)
         -> runner -> Engine (+ a Speculator, its draft model's runner built the same way)

    with open_session() as s:                       # the embedded SmolLM2 model
        ids = s.chat_prompt_ids([{"role": "user", "content": "Hi"}])
        print(s.engine.generate(Request(ids)).text)

The chat TUI, `localinfer generate`, `serve` and the benchmarks start with :func:`open_session`;
`budget --verify` and `quality` build bare runners with :func:`open_model` + :func:`build_runner`.
So they agree on defaults, on the budget's verdict and on how a chat becomes token ids.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.backend_budget import step_prompt_tokens
from localinfer.budget.report import DEFAULT_CTX, BudgetReport
from localinfer.engine import Engine
from localinfer.engine.kv.tiers import KVTierInfo, KVTiers
from localinfer.engine.speculative import DraftProposer, SpecConfig, Speculator
from localinfer.errors import InvalidParameterError, UnsupportedModelError
from localinfer.loader_thread import loads_in_own_thread
from localinfer.loading.model import LoadedModel
from localinfer.runner_setup import (
    DEFAULT_MODEL,
    DEFAULT_SLOTS,
    BuiltRunner,
    OpenedModel,
    RunnerSettings,
    budgeted_kv_ram,
    build_kv_tiers,
    build_runner,
    check_budget,
    open_model,
)
from localinfer.speculation import NGRAM, check_draft_model, default_spec_config, draft_source

# "host": every token drawn by the engine's host sampler, none inside the runner (a benchmark's
# reference, or a way round a runner's sampler); the default lets the runner draw what it can.
SAMPLING_ENV = "LOCALINFER_SAMPLING"

if TYPE_CHECKING:
    from localinfer.budget.memory import DeviceMemory
    from localinfer.catalog import CatalogEntry
    from localinfer.constraints import CompiledConstraint, ConstraintCompiler, ConstraintSpec
    from localinfer.engine import EmbeddingResult
    from localinfer.engine.images import ImagePrompt, RGBImage
    from localinfer.kv_options import KVTierOptions
    from localinfer.loading.embedding_spec import EmbeddingSpec
    from localinfer.rpc_nodes import RpcOptions

__all__ = [
    "DEFAULT_CTX",
    "DEFAULT_MODEL",
    "DEFAULT_SLOTS",
    "BuiltRunner",
    "OpenedModel",
    "RunnerSettings",
    "Session",
    "build_runner",
    "check_budget",
    "open_model",
    "open_session",
]

log = logging.getLogger(__name__)


def no_chat_reason(name: str, base_model: bool) -> str:
    """Why ``name`` takes no chat turns, and what to use instead."""
    why = (
        "is a base model (pretrained, not instruction-tuned): it continues text rather than "
        "answering turns"
        if base_model
        else "ships no chat template, and its vocabulary has no turn tokens a built-in one could "
        "use (it looks like a base model)"
    )
    return (
        f"{name} {why}; send it plain text instead (`localinfer generate --raw`, "
        "/v1/completions), or pick an instruction-tuned model"
    )


@dataclass(slots=True)
class Session:
    model: LoadedModel
    engine: Engine
    runner_notice: str  # one line: which backend and why
    backend: str
    speculator: Speculator | None = None  # --draft: n-gram or a draft model (owns its runner)
    budget: BudgetReport | None = None  # the budget the session was let in on (None: --force)
    tiers: KVTiers = field(default_factory=KVTiers)  # KV tiers below the slots (#24)
    base_model: bool = False  # the catalog knows it as pretrained only: no chat turns
    _closed: bool = field(default=False, repr=False)
    _compiler: ConstraintCompiler | None = field(default=None, repr=False)
    _compiler_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _embedding_spec: EmbeddingSpec | None = field(default=None, repr=False)

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def chat_prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the model's chat template, ready to answer.

        Refused (UnsupportedModelError, a 400 in the server) for a model that cannot take chat
        turns: one the catalog knows as a base model, or one that ships no template and has no
        turn tokens a built-in template could use."""
        return self.render_chat(messages, **template_vars)[1]

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> tuple[str, list[int]]:
        """The prompt text the chat template rendered for ``messages`` and its token ids (a
        thinking model's prompt says whether it opened or closed the reasoning block)."""
        template = self.model.chat_template
        if self.base_model or template is None:
            raise UnsupportedModelError(no_chat_reason(self.model.name, self.base_model))
        text = template.render(messages, add_generation_prompt=True, **template_vars)
        tok = self.model.tokenizer
        # Special-token text in the rendered prompt (<|im_start|>, a literal BOS) becomes ids;
        # BOS is added only when the model wants one and the template did not write it.
        ids = tok.encode(text, add_special_tokens=False)
        if getattr(tok, "add_bos", False) and tok.bos_id is not None and ids[:1] != [tok.bos_id]:
            ids = [tok.bos_id, *ids]
        return text, ids

    def raw_prompt_ids(self, text: str) -> list[int]:
        """Token ids of plain text (no chat template), with BOS when the model wants one."""
        return self.model.tokenizer.encode(text, add_special_tokens=True)

    def image_prompt(self, text: str, images: Sequence[RGBImage]) -> ImagePrompt:
        """``text`` (a rendered chat or plain text, IMAGE_MARKER where each image goes) as ids
        and images for ``Request(ids, images=...)``, through the model's projector; refused
        (UnsupportedModelError) when this session reads no images (engine/images.py)."""
        from localinfer.engine.images import image_prompt

        return image_prompt(self.engine.runner, self.model.tokenizer, text, images)

    def compile_constraint(self, spec: ConstraintSpec) -> CompiledConstraint:
        """``spec`` compiled for this model, ready for ``Request(constraint=...)``.

        Raises InvalidParameterError naming ``spec.field`` when the source cannot be built. Safe
        from any thread (servers compile in a worker thread); the vocabulary index (~0.2 s) is
        built once, on first use."""
        with self._compiler_lock:
            if self._compiler is None:
                from localinfer.constraints import ConstraintCompiler, vocabulary_from_tokenizer

                # The logits may be wider than the tokenizer (a padded embedding): the masks
                # cover every column, the extra ids never allowed.
                width = self.engine.runner.info.vocab_size
                vocabulary = vocabulary_from_tokenizer(self.model.tokenizer, width)
                self._compiler = ConstraintCompiler(vocabulary)
            compiler = self._compiler
        return compiler.compile(spec)

    @property
    def embedding_spec(self) -> EmbeddingSpec:
        """How this model's embeddings are pooled and may be shortened (read once)."""
        if self._embedding_spec is None:
            from localinfer.loading.embedding_spec import embedding_spec

            self._embedding_spec = embedding_spec(self.model)
        return self._embedding_spec

    def embed(
        self, inputs: Sequence[str | Sequence[int]], *, dimensions: int | None = None
    ) -> EmbeddingResult:
        """Unit vectors of ``inputs``, in order, through the engine's queue: a text is tokenized
        as raw text (with BOS when the model wants one), a list of ids is used as given. Pooled
        as the model declares (``embedding_spec``); ``dimensions`` shortens them to their first
        components, renormalised (UnsupportedModelError above the model's width)."""
        from localinfer.engine import EmbeddingRequest
        from localinfer.loading.embedding_spec import shortened

        spec = self.embedding_spec
        cut = spec.check_dimensions(dimensions)
        ids = [self.raw_prompt_ids(x) if isinstance(x, str) else list(x) for x in inputs]
        result = self.engine.embed(EmbeddingRequest(ids, spec.pooling)).result()
        if cut is None:
            return result
        return dataclasses.replace(result, vectors=shortened(result.vectors, cut))

    @property
    def kv_tiers(self) -> list[KVTierInfo]:
        """The KV tiers (RAM, disk) with their caps and what they hold now; [] when none."""
        return self.tiers.describe()

    def persist_kv(self, prompt_ids: Sequence[int]) -> int:
        """Keep the KV of ``prompt_ids``' longest cached prefix in the tiers (a conversation the
        chat closes); returns how many tokens were kept (0 without tiers)."""
        if not self.tiers.stores:
            return 0
        return self.engine.persist_prefix(prompt_ids)

    def close(self) -> None:
        """Stop the engine and free the runners; with a disk tier the slots' and the RAM tier's
        KV are written to disk first (Engine.close flushes the tiers; serve and chat both close
        through here)."""
        if self._closed:
            return
        self._closed = True
        self.engine.close()
        self.engine.runner.close()
        if self.speculator is not None:
            self.speculator.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@loads_in_own_thread
def open_session(
    model_spec: str | None = None,
    *,
    backend: str | None = None,
    ctx: int | None = None,
    slots: int = DEFAULT_SLOTS,
    dtype: str | None = None,
    quant: str | None = None,
    kv_dtype: str | None = None,
    threads: int | None = None,
    max_queue: int = 64,
    prefill_chunk: int | None = None,
    prefix_reuse: bool = True,
    cache_reuse: int = 0,
    kv: KVTierOptions | None = None,
    draft: str | None = None,
    draft_backend: str | None = None,
    spec_config: SpecConfig | None = None,
    rpc: RpcOptions | None = None,  # --rpc: the model split across machines (rpc_nodes.py)
    force: bool = False,
    budget_memory: DeviceMemory | None = None,
    mmproj: str | None = None,
) -> Session:
    """Resolve, budget, load and start ``model_spec`` (default: the embedded SmolLM2-135M).

    ``ctx``, ``dtype``, ``quant``, ``kv_dtype``: see RunnerSettings (``dtype``: bfloat16 on a
    GPU, float32 on CPU; llama.cpp keeps the file's types). The budget refuses what does not fit
    before any weight loads; ``force`` loads anyway. ``prefill_chunk``: prompt tokens a step
    carries (None: what the backend's profile sizes a forward for, docs/measurements.md).
    ``prefix_reuse`` (on by default) lets a new request reuse the KV of an idle slot that shares
    its prompt's beginning; ``cache_reuse`` N > 0 also moves cached chunks of N+ tokens found
    later in the prompt instead of prefilling them (an approximation: see
    localinfer/engine/kv/chunk_reuse.py). ``kv`` (--kv-ram/--kv-disk; None: no tiers) keeps
    slots' KV below the slots: a RAM tier (``kv.ram`` None: the budget's default share, "0":
    off) spilling into a disk tier (``kv.disk``) that close() fills and a later
    session restores from; they need prefix reuse and a runner's KV cache with KVTransfer, else
    they are off and ``Session.tiers.notice`` says why. ``draft`` turns on speculative decoding:
    ``"ngram"``, ``"auto"`` (the catalog's recommended draft model), a draft model spec, or
    None/``"off"``; a draft model runs on ``draft_backend`` (default: the target's);
    ``spec_config`` overrides the settings chosen for the backend. ``budget_memory``: what the
    budget counts against (serve's pool: --device SIZE or the free memory before its models
    loaded); None: the device's free memory now. ``mmproj``: the vision projector
    (runner_setup's find_projector; None: one found beside the GGUF, "none": none).
    """
    if cache_reuse < 0:
        raise InvalidParameterError(f"--cache-reuse must be >= 0, got {cache_reuse}")
    if cache_reuse and not prefix_reuse:
        raise InvalidParameterError("--cache-reuse needs prefix reuse, which is off")
    # --quant none picks a catalog model's original weights (open_model), run as they are.
    runner_quant = quant if quant and quant.lower() != "none" else None
    settings = RunnerSettings(backend, ctx, slots, dtype, runner_quant, threads, force=force,
                              kv_ram=budgeted_kv_ram(kv, prefix_reuse),  # checks the tier flags
                              kv_dtype=kv_dtype, memory=budget_memory,
                              mmproj=mmproj)  # fmt: skip
    opened = open_model(model_spec, quant)
    if rpc is not None:
        settings = dataclasses.replace(settings, rpc=rpc)
    target = build_runner(opened.model, settings)
    speculator = None
    try:
        tiers = build_kv_tiers(kv, target, prefix_reuse=prefix_reuse)
        speculator = _speculator(draft, opened.entry, target, settings, draft_backend, spec_config)
        engine = Engine(
            target.runner,
            opened.model.tokenizer,
            max_queue=max_queue,
            prefill_chunk=prefill_chunk or step_prompt_tokens(target.choice.name),
            prefix_reuse=prefix_reuse,
            cache_reuse=cache_reuse,
            speculator=speculator,
            kv_stores=tiers.stores,
            sample_in_runner=os.environ.get(SAMPLING_ENV, "runner") != "host",
        )
    except Exception:
        target.runner.close()
        if speculator is not None:
            speculator.close()
        raise
    return Session(opened.model, engine, target.choice.notice, target.choice.name, speculator,
                   target.budget, tiers, _is_base_model(opened))  # fmt: skip


def _is_base_model(opened: OpenedModel) -> bool:
    return opened.entry is not None and opened.entry.base_model


def _speculator(
    draft: str | None,
    entry: CatalogEntry | None,
    target: BuiltRunner,
    settings: RunnerSettings,
    draft_backend: str | None,
    config: SpecConfig | None,
) -> Speculator | None:
    """The Speculator ``draft`` asks for (None: off), set up for the target's backend."""
    source = draft_source(draft, target.model.name, entry)
    if source is None:
        return None
    config = config or default_spec_config(
        target.choice.name,
        target.config.device,
        with_draft=source != NGRAM,
        weights=target.runner.info.quant,
    )
    if source == NGRAM:
        return Speculator(config)
    draft_model = open_model(source).model
    check_draft_model(target.model, draft_model, target.config.max_ctx)
    # The draft keeps its own file's quantization; slots, context, dtype and threads follow the
    # target's, and the budget asks about it with the target already loaded.
    built = build_runner(
        draft_model,
        dataclasses.replace(
            settings,
            backend=draft_backend or target.choice.name,
            ctx=target.config.max_ctx,
            dtype=target.config.dtype,
            quant=None,
            kv_ram=None,  # the target's tier is the session's only one
            rpc=None,  # the draft runs here whole
            mmproj="none",  # the target reads the images
            # The target's cache type where the draft runs on the same backend; another
            # backend keeps its own (torch and MLX have only their compute dtype).
            kv_dtype=settings.kv_dtype if draft_backend in (None, target.choice.name) else None,
        ),
    )
    proposer = DraftProposer(built.runner, vocab_size=draft_model.tokenizer.vocab_size)
    return Speculator(config, proposer)
