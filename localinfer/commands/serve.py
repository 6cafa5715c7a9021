"""`localinfer serve [MODEL ...]`: the local OpenAI-compatible endpoint.

The socket is bound first (a busy port is a one-line error, not a traceback), uvicorn starts at
once so ``/health`` answers "loading", and the named models load in the background (the first is
the default for requests that name none). If loading fails the server stops and the command exits
with the loader's one-line error. Other models load when a request names them, within the memory
budget (localinfer/server/model_pool.py).
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import math
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from localinfer.command_help import command_parser
from localinfer.commands._serve_options import add_request_options
from localinfer.errors import InvalidParameterError, LocalinferError
from localinfer.kv_options import add_kv_options, kv_settings
from localinfer.model_options import (
    add_cache_reuse_option,
    add_draft_options,
    add_mmproj_option,
    add_model_options,
    draft_settings,
    model_settings,
)

if TYPE_CHECKING:
    from localinfer.server.limits import RequestLimits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_KEEP_ALIVE = "5m"
DEFAULT_LOAD_WAIT_S = 120.0
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DEFAULT_PORT = 8000
API_KEY_ENV = "LOCALINFER_API_KEY"


def register(subparsers: Any) -> None:
    p = command_parser(subparsers, "serve", run)
    p.add_argument(
        "model",
        nargs="*",
        metavar="MODEL",
        help="catalog name, GGUF file or model folder, loaded at start; the first serves "
        "requests that name no model (default: the embedded SmolLM2-135M)",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on /v1 (or set ${API_KEY_ENV})",
    )
    p.add_argument("--slots", type=int, default=4, help="requests run at once (default 4)")
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from ORIGIN (repeatable; '*' for any)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="also answer requests addressed to the name HOST (repeatable; '.example.com' for "
        "its subdomains too). Addresses and localhost are always answered; other names are "
        "refused against DNS rebinding. '*' turns the Host/Origin check off (needs --api-key)",
    )
    # The limits' defaults live in localinfer.server.limits.RequestLimits (not imported here:
    # every command registers its flags at start-up, and the server pulls in FastAPI).
    p.add_argument(
        "--max-body-size",
        metavar="SIZE",
        help="largest request body, like 8MiB; more is a 413 (default 8MiB)",
    )
    p.add_argument(
        "--max-header-size",
        metavar="SIZE",
        help="largest request line + headers, like 64KiB; more is a 431 (default 64KiB)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        metavar="S",
        help="seconds a client has to send a request's head (default 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        metavar="S",
        help="seconds a client has to send a request's body (default 30)",
    )
    add_kv_options(p)
    p.add_argument(
        "--served-name", help="model id clients see for the first MODEL (default: its name)"
    )
    p.add_argument(
        "--max-queue", type=int, default=64, help="waiting requests before 503 (default: 64)"
    )
    add_request_options(p)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    add_model_options(p)
    add_mmproj_option(p, "the vision projector to load (default: an mmproj*.gguf beside a GGUF "
                      "model, which then reads images; none: none)")  # fmt: skip
    add_cache_reuse_option(p)
    add_draft_options(p)
    _add_pool_options(p)
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="default: info",
    )


def _add_pool_options(p: argparse.ArgumentParser) -> None:
    """What a request may load beyond the named models, and when models unload."""
    p.add_argument(
        "--models-from",
        choices=("catalog", "local", "none"),
        default="catalog",
        help="what a request may load on demand: catalog models and cached Hugging Face repos on "
        "this machine (catalog, the default), those and any model path (local), or only the "
        "models named here (none). Nothing is downloaded",
    )
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="MODEL",
        help="never unload MODEL, for idleness or for another model's memory (repeatable)",
    )
    p.add_argument(
        "--keep-alive",
        default=DEFAULT_KEEP_ALIVE,
        metavar="DURATION",
        help="unload a model loaded on demand once idle this long, like 30s, 5m, 1h (default "
        f"{DEFAULT_KEEP_ALIVE}; -1 never). Models named at start stay until their memory is needed",
    )
    p.add_argument(
        "--device",
        metavar="SIZE",
        help="memory the loaded models share, like 8GiB (default: the device's free memory at "
        "start); a model that does not fit beside the others unloads idle ones first",
    )
    p.add_argument(
        "--load-wait",
        type=float,
        default=DEFAULT_LOAD_WAIT_S,
        metavar="S",
        help="seconds a request waits for its model to load, or for busy models to free the "
        f"memory it needs, before a 503 with Retry-After (default {DEFAULT_LOAD_WAIT_S:g})",
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidParameterError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, else from the environment; an empty one is an error, never "no
    key" (a script that sets an empty variable would otherwise serve without authentication)."""
    if args.api_key is not None:
        if not args.api_key.strip():
            raise InvalidParameterError(
                "--api-key is empty: give a key, or leave the flag out to serve without one"
            )
        return args.api_key
    key = os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise InvalidParameterError(
            f"${API_KEY_ENV} is set but empty: give it a key, or unset it to serve without one"
        )
    return key


def _limits(args: argparse.Namespace) -> RequestLimits:
    from localinfer.budget.memory import parse_size
    from localinfer.server.limits import RequestLimits

    def size(flag: str, text: str | None, default: int) -> int:
        if text is None:
            return default
        try:
            return parse_size(text)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"{flag}: {exc}") from None

    def seconds(flag: str, value: float | None, default: float) -> float:
        if value is None:
            return default
        if not (value > 0 and math.isfinite(value)):
            raise InvalidParameterError(f"{flag} must be a positive number of seconds, got {value}")
        return value

    default = RequestLimits()
    return RequestLimits(
        max_body_bytes=size("--max-body-size", args.max_body_size, default.max_body_bytes),
        max_header_bytes=size("--max-header-size", args.max_header_size, default.max_header_bytes),
        header_timeout_s=seconds("--header-timeout", args.header_timeout, default.header_timeout_s),
        body_timeout_s=seconds("--body-timeout", args.body_timeout, default.body_timeout_s),
    )


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    from localinfer.server.host_guard import HostPolicy

    api_key = _api_key(args)
    limits = _limits(args)
    # The name the server is bound to (--host box.lan) is one it answers to.
    allowed_hosts = [args.host, *args.allowed_host]
    HostPolicy.build(allowed_hosts, cors_origins=args.cors_origin, has_api_key=bool(api_key))

    import uvicorn

    from localinfer.server import create_app
    from localinfer.server.host import uvicorn_config
    from localinfer.server.image_fetch import ImageFetch
    from localinfer.server.model_loading import named_source
    from localinfer.server.model_pool import ModelPool, PoolSettings

    # Resolving is cheap and catches the common mistakes (a typo in MODEL, a model that is not
    # downloaded) before anything starts listening.
    supply, names = _supply(args)
    sources = [named_source(supply, n, args.served_name if i == 0 else None) for i, n in names]
    pins = [named_source(supply, name) for name in args.pin]
    pool = ModelPool(
        supply, PoolSettings(keep_alive_s=parse_keep_alive(args.keep_alive), wait_s=args.load_wait)
    )
    sock = _bind(args.host, args.port)
    port = sock.getsockname()[1]
    servers: list[uvicorn.Server] = []  # the server once built: a failed load stops it
    app = create_app(
        pool=pool,
        start_up=functools.partial(_start_models, args, port, servers, sources, pins),
        api_key=api_key,
        cors_origins=args.cors_origin,
        allowed_hosts=allowed_hosts,
        limits=limits,
        context_overflow=args.context_overflow,
        image_fetch=ImageFetch.from_option(args.allow_image_urls),
    )
    if not api_key and not _is_loopback(args.host):
        print(
            f"localinfer: warning: listening on {args.host} without --api-key; anyone who can "
            "reach this address can use the model",
            file=sys.stderr,
        )
    print(
        f"localinfer: loading {len(sources)} model{'s' if len(sources) > 1 else ''}; /health "
        f"says 'ok' when ready (port {port})",
        file=sys.stderr,
        flush=True,
    )
    server = uvicorn.Server(uvicorn_config(app, args.host, port, log_level=args.log_level))
    servers.append(server)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn re-raises Ctrl-C after its graceful shutdown: a normal stop
    finally:
        sock.close()
    failure = app.state.localinfer.load_exception
    if failure is not None:
        if isinstance(failure, LocalinferError):
            raise failure
        raise LocalinferError(f"loading the model failed: {type(failure).__name__}: {failure}")
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    if args.slots < 1:
        raise InvalidParameterError(f"--slots must be at least 1, got {args.slots}")
    if args.max_queue < 0:
        raise InvalidParameterError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.cache_reuse < 0:
        raise InvalidParameterError(f"--cache-reuse must be >= 0, got {args.cache_reuse}")
    if not 0 <= args.port <= 65535:
        raise InvalidParameterError(f"--port must be 0..65535, got {args.port}")
    if not (args.load_wait >= 0 and math.isfinite(args.load_wait)):
        raise InvalidParameterError(f"--load-wait must be >= 0 seconds, got {args.load_wait}")
    parse_keep_alive(args.keep_alive)


def parse_keep_alive(text: str) -> float | None:
    """--keep-alive: '5m' -> 300.0, '30s', '1h', '500ms', a bare number of seconds; '-1' (any
    negative) -> None, never."""
    value = text.strip().lower()
    units = sorted(_DURATION_UNITS, key=len, reverse=True)  # "ms" before "s"
    unit = next((u for u in units if value.endswith(u)), "")
    number = value[: len(value) - len(unit)].strip() if unit else value
    try:
        seconds = float(number) * _DURATION_UNITS.get(unit, 1.0)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise InvalidParameterError(
            f"--keep-alive: cannot read '{text}' as a duration; write it like 30s, 5m, 1h or -1"
        )
    return None if seconds < 0 else seconds


def _supply(args: argparse.Namespace) -> tuple[Any, list[tuple[int, str]]]:
    """The pool's supply for serve's flags, and the start-up model names, numbered."""
    from localinfer.budget.memory import parse_size
    from localinfer.server.model_loading import LoadSettings, ServeSupply
    from localinfer.session import DEFAULT_MODEL

    memory = None
    if args.device is not None:
        try:
            memory = parse_size(args.device)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"--device: {exc}") from None
    options = {
        "slots": args.slots,
        "dtype": args.dtype,
        "max_queue": args.max_queue,
        "cache_reuse": args.cache_reuse,
        **kv_settings(args),
        **draft_settings(args),
        **model_settings(args),
    }
    typed = {name: options.pop(name) for name in ("slots", "ctx", "backend", "quant", "dtype")}
    settings = LoadSettings(
        **typed,
        force=options.pop("force"),
        memory=memory,
        models_from=args.models_from,
        options=options,
    )
    names = list(dict.fromkeys(args.model or [DEFAULT_MODEL]))
    return ServeSupply(settings, [*names, *args.pin]), list(enumerate(names))


def _start_models(
    args: argparse.Namespace,
    port: int,
    servers: list[Any],
    sources: list[Any],
    pins: list[Any],
    pool: Any,
) -> None:
    """Load the named models (in the server's start-up thread) and say where they are served."""
    try:
        pool.start(sources, pins)
    except BaseException:
        for server in servers:
            server.should_exit = True  # nothing to serve: stop and report
        raise
    for view in pool.views():
        session = view.session
        if session is None:
            continue
        notice = getattr(session, "runner_notice", "")
        print(
            f"localinfer: serving {view.id} at http://{args.host}:{port}/v1 "
            f"({notice}; {args.slots} slots x {session.engine.max_ctx} tokens)",
            file=sys.stderr,
            flush=True,
        )
    if args.models_from != "none":
        print(
            f"localinfer: other models on this machine load when a request names them "
            f"(--models-from {args.models_from}; GET /v1/models lists them)",
            file=sys.stderr,
            flush=True,
        )
