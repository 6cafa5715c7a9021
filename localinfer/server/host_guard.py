"""Who may drive the server from a browser: the ``Host`` and ``Origin`` rule against DNS rebinding.

A web page the user visits can point a name it controls at 127.0.0.1 (DNS rebinding); the
browser then treats the local server as that page's own origin and lets the page read its
answers. Such a request still carries the page's name in ``Host``, so the server answers only
Host values that cannot be rebound:

* an IP address (a page served from an address *is* that address; only names can be rebound),
* ``localhost``,
* names given with ``--allowed-host`` (``.example.com`` also allows every subdomain),

and, for requests that do something (anything but GET/HEAD/OPTIONS), an ``Origin`` that is one
of those hosts or a ``--cors-origin``. ``--allowed-host '*'`` turns both checks off; it needs an
API key, which then is the only guard. Non-browser clients send no ``Origin`` and pass.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from localinfer.errors import InvalidParameterError
from localinfer.server.errors import APIError, ErrorCounter, RefusingMiddleware

ANY = "*"
# Methods a browser may send cross-site without asking first, and that change nothing here.
READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def host_name(value: str) -> str | None:
    """The host part of a Host header (or of an --allowed-host entry): lower case, without the
    port, brackets or a trailing dot. None when it is not a host at all."""
    value = value.strip().lower()
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not _is_port(rest)) or not _is_address(inside):
            return None
        return inside
    name, colon, port = value.rpartition(":")
    if colon and ":" not in name:  # "name:port"; more colons: a bare IPv6 address
        if not _is_port(colon + port):
            return None
        value = name
    value = value.rstrip(".")
    if _is_address(value) or _NAME.fullmatch(value):
        return value
    return None


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit()


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """The Host/Origin rule; ``build`` makes one from the command line's values."""

    names: frozenset[str] = frozenset({"localhost"})  # ".example.com": the domain and below
    cors_origins: frozenset[str] = frozenset()  # exact origins, or "*"
    any_host: bool = False

    @classmethod
    def build(
        cls,
        allowed_hosts: Iterable[str] = (),
        *,
        cors_origins: Iterable[str] = (),
        has_api_key: bool,
    ) -> HostPolicy:
        names = {"localhost"}
        any_host = False
        for entry in allowed_hosts:
            if entry.strip() == ANY:
                any_host = True
                continue
            suffix = entry.strip().startswith(".")
            name = host_name(entry.strip().lstrip("."))
            if name is None:
                raise InvalidParameterError(f"--allowed-host {entry!r} is not a host name")
            names.add("." + name if suffix else name)
        if any_host and not has_api_key:
            raise InvalidParameterError(
                "--allowed-host '*' turns off the Host check that stops web pages from driving "
                "the server; it needs --api-key as well"
            )
        origins = frozenset(o.strip().rstrip("/").lower() for o in cors_origins)
        return cls(frozenset(names), origins, any_host)

    def host_allowed(self, header: str) -> bool:
        if self.any_host:
            return True
        name = host_name(header)
        if name is None:
            return False
        if _is_address(name) or name in self.names:
            return True
        return any(
            allowed.startswith(".") and (name == allowed[1:] or name.endswith(allowed))
            for allowed in self.names
        )

    def origin_allowed(self, origin: str) -> bool:
        if self.any_host or ANY in self.cors_origins:
            return True
        normal = origin.strip().rstrip("/").lower()
        if normal in self.cors_origins:
            return True
        if normal == "null":  # sandboxed frames, file:// pages: no host to vouch for
            return False
        parts = urlsplit(normal)
        return parts.scheme in ("http", "https") and self.host_allowed(parts.netloc)


class HostGuardMiddleware(RefusingMiddleware):
    """403 (OpenAI error JSON) for a Host or Origin the policy refuses; pure ASGI, outermost, so
    nothing else runs for such a request."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, on_error: ErrorCounter | None = None):
        super().__init__(app, on_error)
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.policy.any_host:
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope.get("headers", ()):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        # HTTP/1.0 clients may send no Host; browsers always do.
        if host is not None and not self.policy.host_allowed(host):
            await self._refuse(
                scope,
                receive,
                send,
                "host_not_allowed",
                f"Host {host!r} is not allowed: this server answers its own addresses and "
                f"localhost; to use the name {host_name(host) or host!r}, start it with "
                f"--allowed-host {host_name(host) or host}",
            )
            return
        if (
            origin is not None
            and scope["method"] not in READ_ONLY_METHODS
            and not self.policy.origin_allowed(origin)
        ):
            await self._refuse(
                scope,
                receive,
                send,
                "origin_not_allowed",
                f"requests from the web page at Origin {origin!r} are not allowed; to let a "
                f"browser app use this server, start it with --cors-origin {origin}",
            )
            return
        await self.app(scope, receive, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, code: str, message: str
    ) -> None:
        await self.refuse(APIError(403, message, code=code), scope, receive, send)
