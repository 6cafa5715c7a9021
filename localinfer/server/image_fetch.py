"""``serve --allow-image-urls``: an image part's http(s) URL fetched by the server (issue #37).

By default a remote image URL is a 400 (localinfer/image_input.py): a local server must not fetch
addresses for whoever can reach it. With the opt-in, a fetch is bounded and kept off the
machine's own network (server-side request forgery):

* only ``http`` and ``https``; at most :data:`MAX_REDIRECTS` redirects, each hop checked anew;
* the host is resolved here and every address it resolves to must be public (not loopback,
  private, link-local, shared, reserved or multicast), unless the server runs with
  ``--allow-image-urls=private``; the connection then goes to the address that was checked
  (the URL's name kept for Host and TLS), so a DNS answer that changes between the check and the
  connection (rebinding) cannot point it elsewhere; no proxy from the environment is used;
* at most :data:`~localinfer.image_input.MAX_IMAGE_BYTES` read (stopped past it, a larger
  Content-Length refused first), within :data:`TIMEOUT_S` seconds (checked between reads, and
  no read waits longer than the time left when the hop began); no transfer encoding that would
  inflate it (a compressed body is refused).

Each failure is an InvalidParameterError naming the part's field. The policy reaches the
planner, in its worker thread, through :data:`REQUEST_IMAGE_FETCH`, which the routes set for
each request (as ``overflow`` does for the context policy).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.errors import InvalidParameterError
from localinfer.image_input import MAX_IMAGE_BYTES

if TYPE_CHECKING:
    import httpx

TIMEOUT_S = 10.0
MAX_REDIRECTS = 3
OPTION_VALUES = ("public", "private")  # serve --allow-image-urls[=public|private]
_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# getaddrinfo has no timeout of its own: it runs here, waited for at most the fetch's time.
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="localinfer-resolve")


@dataclass(slots=True, frozen=True)
class ImageFetch:
    """How the server fetches a remote image (``None`` where it fetches none)."""

    allow_private: bool = False  # loopback, private and link-local addresses too
    max_bytes: int = MAX_IMAGE_BYTES
    timeout_s: float = TIMEOUT_S
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def from_option(cls, value: str | None) -> ImageFetch | None:
        """``serve --allow-image-urls``: absent (None), ``public`` or ``private``."""
        if value is None:
            return None
        if value not in OPTION_VALUES:
            raise InvalidParameterError(
                f"--allow-image-urls: {value!r}; give public (the default) or private"
            )
        return cls(allow_private=value == "private")


REQUEST_IMAGE_FETCH: ContextVar[ImageFetch | None] = ContextVar("image_fetch", default=None)


@contextmanager
def image_fetch_for_request(fetch: ImageFetch | None) -> Iterator[None]:
    """The server's policy, seen by the planning of this request (its worker thread too)."""
    token = REQUEST_IMAGE_FETCH.set(fetch)
    try:
        yield
    finally:
        REQUEST_IMAGE_FETCH.reset(token)


def is_remote(url: str) -> bool:
    """Whether ``url`` names an address (``scheme://``), not inline data."""
    head = url.strip()[:16].lower()
    return "://" in head and not head.startswith("data:")


def address_refused(address: IPAddress, allow_private: bool) -> str | None:
    """What kind of address ``address`` is, when the policy does not fetch from it."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if address.is_multicast or address.is_unspecified:
        return "multicast" if address.is_multicast else "unspecified"
    if allow_private or address.is_global:
        return None
    for kind in ("loopback", "link_local", "private"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return "non-public"


class _Fetch:
    """One fetch: its field (for errors), its policy and its deadline."""

    def __init__(self, field: str, policy: ImageFetch) -> None:
        self.field, self.policy = field, policy
        self.deadline = time.monotonic() + policy.timeout_s

    def refuse(self, why: str) -> InvalidParameterError:
        return InvalidParameterError(f"{self.field}: {why}")

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.refuse(f"fetching the image took over {self.policy.timeout_s:g} s")
        return left

    def address(self, host: str, port: int) -> str:
        """The one address of ``host`` to connect to; all it resolves to must pass."""
        try:
            infos = _RESOLVER.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
            found = infos.result(timeout=self.left())
        except FutureTimeout:
            raise self.refuse(f"resolving {host} took over {self.policy.timeout_s:g} s") from None
        except (OSError, UnicodeError) as exc:
            raise self.refuse(f"cannot resolve the image URL's host {host} ({exc})") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
        for address in addresses:
            kind = address_refused(address, self.policy.allow_private)
            if kind is not None:
                also = "" if self.policy.allow_private else (
                    "; the server fetches public addresses only (serve "
                    "--allow-image-urls=private also fetches loopback, private and link-local ones)"
                )  # fmt: skip
                raise self.refuse(f"{host} resolves to {address}, a {kind} address{also}")
        return str(addresses[0])

    def url(self, text: str) -> httpx.URL:
        import httpx

        try:
            url = httpx.URL(text.strip())
        except httpx.InvalidURL as exc:
            raise self.refuse(f"not a valid URL ({exc})") from None
        if url.scheme not in _PORTS:
            raise self.refuse(f"only http and https image URLs are fetched, not {url.scheme!r}")
        if not url.host:
            raise self.refuse("the image URL has no host")
        return url


def fetch_image(url: str, field: str, policy: ImageFetch) -> bytes:
    """The bytes at ``url`` under ``policy`` (module doc); InvalidParameterError naming
    ``field`` for anything refused or failed."""
    import httpx

    fetch = _Fetch(field, policy)
    current = fetch.url(url)
    with httpx.Client(trust_env=False, follow_redirects=False) as client:
        for _ in range(policy.max_redirects + 1):
            address = fetch.address(current.host, current.port or _PORTS[current.scheme])
            try:
                body, location = _get(client, fetch, current, address)
            except httpx.TimeoutException:
                raise fetch.refuse(f"fetching the image took over {policy.timeout_s:g} s") from None
            except httpx.HTTPError as exc:
                raise fetch.refuse(f"the image could not be fetched ({exc})") from None
            if location is None:
                return body
            current = fetch.url(str(current.join(location)))
    raise fetch.refuse(f"the image URL redirects more than {policy.max_redirects} times")


def _get(
    client: httpx.Client, fetch: _Fetch, url: httpx.URL, address: str
) -> tuple[bytes, str | None]:
    """One GET of ``url`` from ``address``: (the body, None), or (b"", a redirect's target)."""
    headers = {"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"}
    pinned = url.copy_with(host=address)
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    with client.stream(
        "GET", pinned, headers=headers, extensions=extensions, timeout=fetch.left()
    ) as response:
        if response.has_redirect_location:
            return b"", response.headers["Location"]
        if response.status_code != 200:
            raise fetch.refuse(f"fetching the image answered HTTP {response.status_code}")
        if response.headers.get("Content-Encoding", "identity").lower() != "identity":
            raise fetch.refuse("the image came compressed (Content-Encoding); serve it as is")
        limit = fetch.policy.max_bytes
        size = response.headers.get("Content-Length", "")
        if size.isdigit() and int(size) > limit:
            raise fetch.refuse(f"the image is {size} bytes; at most {_amount(limit)}")
        chunks, got = [], 0
        for chunk in response.iter_raw():
            got += len(chunk)
            if got > limit:
                raise fetch.refuse(f"the image is over {_amount(limit)}; at most that is read")
            fetch.left()  # a server that trickles the body stops at the deadline
            chunks.append(chunk)
    return b"".join(chunks), None


def _amount(size: int) -> str:
    return f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size} bytes"
