"""`localinfer chat [MODEL]`: the terminal chat app (Textual); heavy imports happen in run()."""

from __future__ import annotations

import argparse

from localinfer.threads_option import add_threads_option


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal",
        description="Chat with a model in the terminal (default: the embedded SmolLM2-135M). "
        "Enter sends, Shift+Enter or Ctrl+J adds a newline, Esc stops an answer.",
    )
    parser.add_argument("model", nargs="?", default=None, help="catalog name, GGUF file or folder")
    parser.add_argument("--backend", choices=("llamacpp", "torch", "mlx"), default=None)
    parser.add_argument("--quant", default=None, help="weight quantization (default: the file's)")
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot (default 2048)")
    parser.add_argument("--slots", type=int, default=1, help="concurrent sequences (default 1)")
    add_threads_option(parser)
    parser.add_argument(
        "--draft", default=None, help="speculative decoding: ngram, auto, a draft model, or off"
    )
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localinfer.errors import InvalidParameterError
    from localinfer.tui.host import ChatHost
    from localinfer.tui.settings import ChatSettings

    if args.ctx < 64:
        raise InvalidParameterError(f"--ctx must be at least 64, got {args.ctx}")
    if args.slots < 1:
        raise InvalidParameterError(f"--slots must be at least 1, got {args.slots}")
    settings = ChatSettings(
        model=args.model,
        backend=args.backend,
        quant=args.quant,
        ctx=args.ctx,
        slots=args.slots,
        threads=args.threads,
        speculative={None: "off", "off": "off", "ngram": "ngram"}.get(args.draft, "draft"),
        draft=args.draft,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
    )
    # The model starts loading now, while the engine and Textual import and the window comes up;
    # the app's load worker collects it and shows progress until then.
    host = ChatHost(settings)
    host.load_in_background(settings)
    try:
        settings.validated()
        from localinfer.conversations import ConversationStore
        from localinfer.tui.app import ChatApp

        app = ChatApp(host, ConversationStore())
        app.run()
    finally:
        host.close()
    # Textual prints an unhandled exception's traceback and sets return_code 1: pass that on, so
    # a crash is never a successful exit.
    return app.return_code or 0
