"""`localinfer generate [MODEL] PROMPT`: one answer, streamed to stdout; metrics on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.command_help import command_parser
from localinfer.errors import InvalidParameterError, LocalinferError
from localinfer.model_options import (
    add_draft_options,
    add_mmproj_option,
    add_model_options,
    draft_settings,
    model_settings,
)

if TYPE_CHECKING:
    from localinfer.constraints import ConstraintSpec

MEDIA_MARKER = "<__media__>"  # where --image goes in PROMPT (llama.cpp's mtmd marker)


def register(subparsers: Any) -> None:
    p = command_parser(subparsers, "generate", run)
    p.add_argument("model", nargs="?", metavar="MODEL", help="default: smollm2-135m (embedded)")
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads it from stdin")
    p.add_argument("--system", help="system message (chat template only)")
    p.add_argument("--raw", action="store_true", help="send PROMPT as is, no chat template")
    p.add_argument(
        "--suffix",
        metavar="TEXT",
        help="fill in the middle: PROMPT is the text before the cursor, TEXT the text after it "
        "(a model with FIM tokens, e.g. qwen2.5-coder-0.5b; no chat template)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a stream")
    p.add_argument("--max-tokens", type=int, default=256, help="default: 256")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="default: 1.0 (off)")
    p.add_argument("--top-k", type=int, default=0, help="default: 0 (off)")
    p.add_argument("--min-p", type=float, default=0.0, help="default: 0.0 (off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="default: 1.0 (off)")
    p.add_argument("--seed", type=int, help="sampling seed, any integer (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="run to --max-tokens past the end-of-text token (for timing a fixed length)",
    )
    p.add_argument(
        "--thinking",
        choices=("on", "off"),
        help="a thinking model (Qwen3, R1 distills): reason first or not (default: its template's)",
    )
    p.add_argument("--thinking-budget", type=int, metavar="N", help="at most N reasoning tokens")
    p.add_argument(
        "--hide-thinking", action="store_true", help="do not print the reasoning (stderr, dimmed)"
    )
    p.add_argument("--slots", type=int, default=1, help="sequences allocated (default: 1)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        metavar="FILE|JSON",
        help="the answer is JSON valid under this JSON Schema (a file, or the schema's text)",
    )
    shape.add_argument("--regex", metavar="PATTERN", help="the whole answer matches PATTERN")
    shape.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image the prompt is about (repeatable): each goes where PROMPT writes "
        "<__media__>, else before it. Needs a vision projector on the llama.cpp runner",
    )
    add_mmproj_option(
        p, "the vision projector to load (default: an mmproj*.gguf beside the model; none: none)"
    )
    add_model_options(p)
    add_draft_options(p)


def _sampling(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from localinfer.engine import SamplingParams

    try:
        return SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            # Any int, as the server takes it: numpy's generators want a non-negative seed.
            seed=None if args.seed is None else args.seed % 2**64,
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "parameter"
        raise InvalidParameterError(f"{name}: {err['msg']}") from None


def _constraint_spec(args: argparse.Namespace) -> ConstraintSpec | None:
    """The answer's shape as the options ask it (None: free text); a schema given as a file is
    read here, so its errors come before the model loads."""
    from localinfer.constraints import ConstraintSpec

    if args.regex is not None:
        return ConstraintSpec("regex", args.regex, field="--regex")
    if args.json_object:
        return ConstraintSpec("json_object", field="--json-object")
    if args.json_schema is None:
        return None
    source = args.json_schema
    if not source.lstrip().startswith("{"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise InvalidParameterError(
                f"--json-schema: {source!r} is neither a file nor a JSON object"
            )
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameterError(f"--json-schema: cannot read {path}: {exc}") from None
    return ConstraintSpec("json_schema", source, field="--json-schema")


def run(args: argparse.Namespace) -> int:
    model_spec = args.model
    if args.system and args.raw:
        raise InvalidParameterError("--system needs the chat template; drop --raw")
    if args.system and args.suffix is not None:
        raise InvalidParameterError("--suffix: fill-in-the-middle takes no --system message")
    params = _sampling(args)
    spec = _constraint_spec(args)
    if args.prompt == "-":
        args.prompt = _stdin_prompt()
    if args.thinking_budget is not None and args.thinking_budget < 0:
        raise InvalidParameterError(f"--thinking-budget must be >= 0, got {args.thinking_budget}")
    images = _read_images(args)  # before the model loads: a bad file is refused at once

    from localinfer.engine import Request
    from localinfer.session import open_session
    from localinfer.tools.reasoning_print import ReasoningPrinter

    session = open_session(
        model_spec,
        slots=args.slots,
        dtype=args.dtype,
        **draft_settings(args),
        **model_settings(args),
    )
    try:
        if images:
            ids, params, reasoning, shown = _image_prompt(session, args, params, images)
        else:
            (ids, params, reasoning), shown = _prompt(session, args, params), ()
        constraint = None if spec is None else session.compile_constraint(spec)
        request = Request(ids, params, constraint=constraint, reasoning=reasoning, images=shown)
        handle = session.engine.submit(request)
        try:
            if args.json:
                result = handle.result()
            else:
                show = ReasoningPrinter(sys.stderr, hidden=args.hide_thinking)
                for event in handle:
                    show.reasoning(event.reasoning)
                    if event.text:
                        show.answer_starts()
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
                show.answer_starts()
                result = handle.result()
                sys.stdout.write("\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            handle.abort()
            raise
        if args.json:
            print(json.dumps(_as_json(session, result), ensure_ascii=False))
        else:
            print(_metrics_line(session, result, params.max_tokens), file=sys.stderr)
        if result.finish_reason == "error":
            raise LocalinferError(f"generation failed: {result.error}")
        return 0
    finally:
        session.close()


def _read_images(args: argparse.Namespace) -> list[Any]:
    """``--image`` files decoded (localinfer/image_input.py), each marked in the prompt."""
    if not args.image:
        return []
    from localinfer.engine.images import IMAGE_MARKER
    from localinfer.image_input import check_image_count, read_image_file

    if args.suffix is not None:
        raise InvalidParameterError("--image: fill-in-the-middle takes no images")
    check_image_count(len(args.image), "--image")
    images = [read_image_file(Path(path)) for path in args.image]
    marked = args.prompt.count(MEDIA_MARKER)
    if marked and marked != len(images):
        raise InvalidParameterError(f"--image: {len(images)} images, PROMPT marks {marked}")
    # As llama-mtmd-cli: the images go where <__media__> stands, else before the text.
    text = args.prompt.replace(MEDIA_MARKER, IMAGE_MARKER)
    args.prompt = text if marked else IMAGE_MARKER * len(images) + text
    return images


def _stdin_prompt() -> str:
    """PROMPT '-': all of stdin, less the newline that ends a piped file or echo."""
    if sys.stdin.isatty():
        print("reading the prompt from stdin (end with Ctrl+D)", file=sys.stderr)
    text = sys.stdin.read().rstrip("\r\n")
    if not text.strip():
        raise InvalidParameterError("PROMPT: '-' reads the prompt from stdin, which held none")
    return text


def _image_prompt(
    session: Any, args: argparse.Namespace, params: Any, images: list[Any]
) -> tuple[list[int], Any, Any, tuple[Any, ...]]:
    """``_prompt``'s answer for a prompt with images, tokenized by the model's projector, and
    the images placed in it."""
    from localinfer.image_input import ImageChat

    if args.raw or (session.base_model and not args.system):
        prompt = session.image_prompt(args.prompt, images)
        return prompt.ids, params, None, prompt.images
    chat = ImageChat(session, session.engine.runner, images)
    ids, params, reasoning = _prompt(session, args, params, source=chat)
    return ids, params, reasoning, chat.images


def _prompt(
    session: Any, args: argparse.Namespace, params: Any, source: Any = None
) -> tuple[list[int], Any, Any]:
    """The prompt's token ids, the sampling parameters (with the tokens that end a middle when
    it is a fill-in-the-middle prompt) and a thinking model's reasoning split (or None); a chat
    is rendered by ``source`` (default: the session)."""
    if args.suffix is not None:
        from localinfer.fim import fim_format

        tokenizer = session.tokenizer
        fim = fim_format(tokenizer, field="--suffix", model=session.model.name)
        ids = fim.prompt_ids(tokenizer, args.prompt, args.suffix)
        return ids, params.model_copy(update={"stop_token_ids": fim.stop_ids}), None
    if args.raw or (session.base_model and not args.system):
        if not args.raw:  # a base model completes text: the prompt goes as is, and it says so
            print(f"{session.model.name} is a base model: the prompt is sent as is (--raw)",
                  file=sys.stderr)  # fmt: skip
        return session.raw_prompt_ids(args.prompt), params, None
    messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
    from localinfer.tools.thinking import Thinking, thinking_prompt

    enabled = None if args.thinking is None else args.thinking == "on"
    prompt = thinking_prompt(source or session, messages, Thinking(enabled, args.thinking_budget))
    return prompt.ids, params, prompt.reasoning


def _metrics_line(session: Any, result: Any, max_tokens: int) -> str:
    m = result.metrics
    parts = [session.runner_notice.split(" (")[0]]
    if m is not None:
        if m.ttft_s is not None:
            parts.append(f"TTFT {m.ttft_s * 1000:.0f} ms")
        if m.decode_tps is not None:
            parts.append(f"{m.decode_tps:.1f} tok/s")
        parts.append(f"{m.prompt_tokens} prompt + {m.completion_tokens} completion tokens")
    spec = session.engine.metrics()
    if spec.spec_acceptance_rate is not None:
        parts.append(
            f"speculative: {spec.spec_accepted}/{spec.spec_proposed} accepted, "
            f"{spec.tokens_per_target_forward:.2f} tokens/forward"
        )
    finish = f"finish: {result.finish_reason}"
    if result.finish_reason == "length" and len(result.token_ids) < max_tokens:
        # Stopped short of --max-tokens: the context ran out, which "length" alone hides.
        finish += f" (the {session.engine.max_ctx}-token context is full; raise --ctx)"
    parts.append(finish)
    return " · ".join(parts)


def _as_json(session: Any, result: Any) -> dict[str, Any]:
    m = result.metrics
    usage = {
        "prompt_tokens": m.prompt_tokens if m else None,
        "completion_tokens": m.completion_tokens if m else len(result.token_ids),
        "reasoning_tokens": m.reasoning_tokens if m else 0,
        "total_tokens": (m.prompt_tokens + m.completion_tokens) if m else None,
    }
    metrics = {}
    if m is not None:
        metrics = {
            "ttft_s": m.ttft_s,
            "tpot_s": m.tpot_s,
            "decode_tps": m.decode_tps,
            "prefill_tps": m.prefill_tps,
            "queued_s": m.queued_s,
        }
    spec = session.engine.metrics()
    if spec.spec_acceptance_rate is not None:
        metrics["speculative"] = {
            "proposed": spec.spec_proposed,
            "accepted": spec.spec_accepted,
            "acceptance_rate": spec.spec_acceptance_rate,
            "mean_accepted": spec.spec_mean_accepted,
            "tokens_per_target_forward": spec.tokens_per_target_forward,
        }
    return {
        "model": session.model.name,
        "backend": session.backend,
        "text": result.text,
        "reasoning": result.reasoning or None,
        "finish_reason": result.finish_reason,
        "error": result.error,
        "token_ids": list(result.token_ids),
        "usage": usage,
        "metrics": metrics,
    }
