"""A ready-to-use model: resolve -> load -> runner (backend selection) -> Engine, in one call.

    with open_session() as s:                       # the embedded SmolLM2 model
        ids = s.chat_prompt_ids([{"role": "user", "content": "Hi"}])
        print(s.engine.generate(Request(ids)).text)

The chat TUI, `localinfer generate`, `serve` and the benchmarks all start here, so they agree on
defaults and on how a chat becomes token ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localinfer.engine import Engine
from localinfer.engine.speculative import SpecConfig, Speculator
from localinfer.errors import InvalidParameterError
from localinfer.loading.model import LoadedModel

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_CTX = 2048  # per slot
DEFAULT_SLOTS = 4


@dataclass(slots=True)
class Session:
    model: LoadedModel
    engine: Engine
    runner_notice: str  # one line: which backend and why
    backend: str
    speculator: Speculator | None = None  # --draft: n-gram or a draft model (owns its runner)
    _closed: bool = field(default=False, repr=False)

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def chat_prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the model's chat template, ready to answer."""
        template = self.model.chat_template
        if template is None:
            from localinfer.loading.chat_template import ChatTemplate

            template = ChatTemplate.chatml()
        text = template.render(messages, add_generation_prompt=True, **template_vars)
        tok = self.model.tokenizer
        # Special-token text in the rendered prompt (<|im_start|>, a literal BOS) becomes ids;
        # BOS is added only when the model wants one and the template did not write it.
        ids = tok.encode(text, add_special_tokens=False)
        if getattr(tok, "add_bos", False) and tok.bos_id is not None and ids[:1] != [tok.bos_id]:
            ids = [tok.bos_id, *ids]
        return ids

    def raw_prompt_ids(self, text: str) -> list[int]:
        """Token ids of plain text (no chat template), with BOS when the model wants one."""
        return self.model.tokenizer.encode(text, add_special_tokens=True)

    def close(self) -> None:
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


def open_session(
    model_spec: str | None = None,
    *,
    backend: str | None = None,
    ctx: int | None = None,
    slots: int = DEFAULT_SLOTS,
    dtype: str | None = None,
    quant: str | None = None,
    threads: int | None = None,
    max_queue: int = 64,
    prefill_chunk: int = 256,
    prefix_reuse: bool = True,
    draft: str | None = None,
    draft_backend: str | None = None,
    spec_config: SpecConfig | None = None,
) -> Session:
    """Resolve, load and start ``model_spec`` (default: the embedded SmolLM2-135M).

    ``ctx`` is per slot and defaults to min(2048, the model's trained context); asking for more
    than the model was trained for is an error, never a silent clamp. ``dtype`` defaults to
    bfloat16 on a GPU and float32 on CPU (torch and mlx; llama.cpp keeps the file's types).
    ``prefix_reuse`` (on by default) lets a new request reuse the KV of an idle slot that shares
    its prompt's beginning: the next turn of a chat prefills only the new messages.
    ``draft`` turns on speculative decoding: ``"ngram"`` (lookup in the prompt and output),
    ``"auto"`` (the catalog's recommended draft model), a draft model spec, or None/``"off"``;
    a draft model runs on ``draft_backend`` (default: the target's backend); ``spec_config``
    overrides the speculation settings chosen for the backend (k, costs, busy threshold).
    """
    from localinfer.backends.base import RunnerConfig
    from localinfer.backends.select import choose_backend, create_runner
    from localinfer.loading.loader import load_model
    from localinfer.resolve import resolve_model

    if slots < 1:
        raise InvalidParameterError(f"--slots must be at least 1, got {slots}")
    resolved = resolve_model(model_spec or DEFAULT_MODEL, quant)
    model = load_model(resolved.require_path(), name=resolved.name)
    trained = model.config.max_ctx
    if ctx is None:
        ctx = min(DEFAULT_CTX, trained)
    if ctx < 2:
        raise InvalidParameterError(f"--ctx must be at least 2, got {ctx}")
    if ctx > trained:
        raise InvalidParameterError(
            f"--ctx {ctx} is more than {model.name} was trained for ({trained} tokens)"
        )
    choice = choose_backend(backend, model.format, model.file_quant, model.config.arch)
    if dtype is None:
        dtype = "bfloat16" if choice.device in ("cuda", "metal") else "float32"
    config = RunnerConfig(
        slots=slots,
        max_ctx=ctx,
        dtype=dtype,
        device=choice.device,
        threads=threads,
        quant=quant if quant and quant.lower() != "none" else None,
    )
    runner, _ = create_runner(model, config, choice.name)
    notice = choice.notice  # why *this* backend (create_runner only sees it as requested)
    speculator = None
    try:
        from localinfer.engine.speculative.factory import make_speculator

        speculator = make_speculator(
            draft,
            target=model,
            target_entry=resolved.entry,
            # The draft keeps its own file's quantization; slots and context follow the target.
            runner_config=dataclasses.replace(config, quant=None),
            backend=draft_backend or choice.name,
            target_backend=choice.name,
            target_weights=runner.info.quant,
            config=spec_config,
        )
        engine = Engine(
            runner,
            model.tokenizer,
            max_queue=max_queue,
            prefill_chunk=prefill_chunk,
            prefix_reuse=prefix_reuse,
            speculator=speculator,
        )
    except Exception:
        runner.close()
        if speculator is not None:
            speculator.close()
        raise
    return Session(
        model=model,
        engine=engine,
        runner_notice=notice,
        backend=choice.name,
        speculator=speculator,
    )
