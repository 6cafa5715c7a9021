"""`localinfer serve [MODEL]`: the local OpenAI-compatible endpoint.

The socket is bound first (a busy port is a one-line error, not a traceback), uvicorn starts at
once so ``/health`` answers "loading", and the model loads in the background. If loading fails the
server stops and the command exits with the loader's one-line error.
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
from localinfer.errors import InvalidParameterError, LocalinferError
from localinfer.kv_options import add_kv_options, kv_settings
from localinfer.model_options import (
    add_cache_reuse_option,
    add_draft_options,
    add_model_options,
    draft_settings,
    model_settings,
)

if TYPE_CHECKING:
    from localinfer.server.limits import RequestLimits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
API_KEY_ENV = "LOCALINFER_API_KEY"


def register(subparsers: Any) -> None:
    p = command_parser(subparsers, "serve", run)
    p.add_argument("model", nargs="?", help="catalog name, GGUF file or model folder")
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
    p.add_argument("--served-name", help="model id clients see (default: the model's name)")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 503")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    add_model_options(p)
    add_cache_reuse_option(p)
    add_draft_options(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


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

    from localinfer.resolve import ALIASES, resolve_model
    from localinfer.server import create_app
    from localinfer.server.host import uvicorn_config
    from localinfer.session import DEFAULT_MODEL

    # Resolving is cheap and catches the common mistakes (a typo in MODEL, a model that is not
    # downloaded) before anything starts listening.
    spec = args.model or DEFAULT_MODEL
    resolve_model(spec, args.quant).require_path()
    aliases = {spec, *(alias for alias, target in ALIASES.items() if target == spec)}
    sock = _bind(args.host, args.port)
    port = sock.getsockname()[1]
    servers: list[uvicorn.Server] = []  # the server once built: a failed load stops it
    app = create_app(
        loader=functools.partial(_load_session, args, port, servers),
        api_key=api_key,
        cors_origins=args.cors_origin,
        served_name=args.served_name,
        aliases=aliases,
        allowed_hosts=allowed_hosts,
        limits=limits,
    )
    if not api_key and not _is_loopback(args.host):
        print(
            f"localinfer: warning: listening on {args.host} without --api-key; anyone who can "
            "reach this address can use the model",
            file=sys.stderr,
        )
    print(
        f"localinfer: loading the model; /health says 'ok' when ready (port {port})",
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


def _load_session(args: argparse.Namespace, port: int, servers: list[Any]) -> Any:
    """Open the session (in the server's loader thread) and say where it is served."""
    from localinfer.session import open_session

    try:
        session = open_session(
            args.model,
            slots=args.slots,
            dtype=args.dtype,
            max_queue=args.max_queue,
            cache_reuse=args.cache_reuse,
            **kv_settings(args),
            **draft_settings(args),
            **model_settings(args),
        )
    except BaseException:
        for server in servers:
            server.should_exit = True  # nothing to serve: stop and report
        raise
    name = args.served_name or session.model.name
    print(
        f"localinfer: serving {name} at http://{args.host}:{port}/v1 "
        f"({session.runner_notice}; {args.slots} slots x {session.engine.max_ctx} tokens)",
        file=sys.stderr,
        flush=True,
    )
    return session
