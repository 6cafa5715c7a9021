"""serve --allow-image-urls's fetcher (localinfer/server/image_fetch.py) against a local HTTP
server: what it fetches, and each way a URL is refused (a 400's message naming the field),
without a model. The servers' own tests are in tests/test_server_vision_apis.py."""

from __future__ import annotations

import gzip
import ipaddress
import socket

import pytest

from localinfer.errors import InvalidParameterError
from localinfer.server import image_fetch
from localinfer.server.image_fetch import ImageFetch, address_refused, fetch_image, is_remote
from tests.image_server import body, endless, image_server, redirect, silent

FIELD = "messages[0].content[1].image_url.url"
IMAGE = b"\x89PNG pretend image bytes" * 10
PRIVATE = ImageFetch(allow_private=True)


def refused(url: str, policy: ImageFetch = PRIVATE) -> str:
    with pytest.raises(InvalidParameterError) as error:
        fetch_image(url, FIELD, policy)
    message = str(error.value)
    assert message.startswith(FIELD + ": "), message
    return message


@pytest.mark.parametrize(
    ("address", "public", "private"),
    [
        ("8.8.8.8", None, None),
        ("2606:4700:4700::1111", None, None),
        ("127.0.0.1", "loopback", None),
        ("::1", "loopback", None),
        ("::ffff:127.0.0.1", "loopback", None),  # an IPv4 loopback written as IPv6
        ("10.1.2.3", "private", None),
        ("192.168.1.10", "private", None),
        ("fd12::1", "private", None),
        ("169.254.169.254", "link-local", None),  # the cloud metadata address
        ("fe80::1", "link-local", None),
        ("100.64.0.1", "non-public", None),  # carrier-grade NAT
        ("224.0.0.1", "multicast", "multicast"),
        ("0.0.0.0", "unspecified", "unspecified"),
    ],
)
def test_which_addresses_are_fetched(address: str, public: str | None, private: str | None) -> None:
    ip = ipaddress.ip_address(address)
    assert address_refused(ip, allow_private=False) == public
    assert address_refused(ip, allow_private=True) == private


def test_the_image_is_fetched_through_redirects() -> None:
    routes = {
        "/cat.png": body(IMAGE, Content_Type="image/png"),
        "/moved": redirect("/cat.png", 301),
        "/hop1": redirect("/moved"),
    }
    with image_server(routes) as served:
        routes["/absolute"] = redirect(served.url("/hop1"), 307)
        assert fetch_image(served.url("/cat.png"), FIELD, PRIVATE) == IMAGE
        assert fetch_image(served.url("/absolute"), FIELD, PRIVATE) == IMAGE
    port = served.base.rsplit(":", 1)[1]
    assert [path for path, _ in served.requests][-4:] == [
        "/absolute",
        "/hop1",
        "/moved",
        "/cat.png",
    ]
    assert {host for _, host in served.requests} == {f"127.0.0.1:{port}"}


def test_the_connection_goes_to_the_address_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host is resolved once, checked, and connected to by that address; the URL's name is
    what the server sees in Host (no second lookup that a rebinding DNS could answer)."""
    looked_up: list[str] = []

    def resolve(host: str, port: int, *args: object) -> list[tuple]:
        looked_up.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with image_server({"/cat.png": body(IMAGE)}) as served:
        port = served.base.rsplit(":", 1)[1]
        assert fetch_image(f"http://images.example:{port}/cat.png", FIELD, PRIVATE) == IMAGE
        assert "loopback" in refused(f"http://images.example:{port}/cat.png", ImageFetch())
    # (the connection's own lookup is of the address itself: numeric, no DNS)
    assert [host for host in looked_up if host != "127.0.0.1"] == ["images.example"] * 2
    assert served.requests == [("/cat.png", f"images.example:{port}")]


def test_public_only_refuses_this_machine_before_connecting() -> None:
    with image_server({"/cat.png": body(IMAGE)}) as served:
        port = served.base.rsplit(":", 1)[1]
        for url in (served.url("/cat.png"), f"http://localhost:{port}/cat.png"):
            message = refused(url, ImageFetch())
            assert "a loopback address" in message and "--allow-image-urls=private" in message
    assert served.requests == []  # nothing reached the server


def test_every_redirect_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A public address that redirects to a refused one is refused at that hop: here 127.0.0.1
    plays a public address and 127.0.0.2 a private one."""
    real = image_fetch.address_refused

    def refused_here(address: ipaddress.IPv4Address, allow_private: bool) -> str | None:
        return "private" if str(address) == "127.0.0.2" else real(address, True)

    monkeypatch.setattr(image_fetch, "address_refused", refused_here)
    with image_server({"/cat.png": body(IMAGE)}) as served:
        port = served.base.rsplit(":", 1)[1]
        routes_target = f"http://127.0.0.2:{port}/cat.png"
        with image_server({"/go": redirect(routes_target)}) as first:
            assert "resolves to 127.0.0.2, a private address" in refused(first.url("/go"))
    assert served.requests == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://127.0.0.1/cat.png", "only http and https image URLs are fetched, not 'ftp'"),
        ("file:///etc/passwd", "only http and https image URLs are fetched, not 'file'"),
        ("http:///cat.png", "the image URL has no host"),
        ("http://no-such-host.invalid/cat.png", "cannot resolve the image URL's host"),
    ],
)
def test_urls_that_are_not_fetched(url: str, says: str) -> None:
    assert says in refused(url)


def test_what_a_server_answers_that_is_refused() -> None:
    routes = {
        "/loop": redirect("/loop"),
        "/to-ftp": redirect("ftp://127.0.0.1/cat.png"),
        "/gone": body(b"not here", 404),
        "/huge": body(b"\0" * 2048),
        "/endless": endless(),
        "/zipped": body(gzip.compress(IMAGE), Content_Encoding="gzip"),
    }
    small = ImageFetch(allow_private=True, max_bytes=1024)
    with image_server(routes) as served:
        assert "redirects more than 3 times" in refused(served.url("/loop"))
        assert [p for p, _ in served.requests] == ["/loop"] * 4
        assert "not 'ftp'" in refused(served.url("/to-ftp"))
        assert "answered HTTP 404" in refused(served.url("/gone"))
        assert "is 2048 bytes; at most 1024 bytes" in refused(served.url("/huge"), small)
        assert "over 1024 bytes; at most that is read" in refused(served.url("/endless"), small)
        assert "over 20 MiB" in refused(served.url("/endless"))
        assert "came compressed" in refused(served.url("/zipped"))


def test_a_server_that_does_not_answer_in_time() -> None:
    with image_server({"/slow": silent(3.0)}) as served:
        message = refused(served.url("/slow"), ImageFetch(allow_private=True, timeout_s=0.3))
    assert "fetching the image took over 0.3 s" in message


def test_what_counts_as_remote_and_the_option() -> None:
    assert is_remote("https://example.com/a.png") and is_remote(" HTTP://x/y")
    assert is_remote("ftp://example.com/a.png")
    assert not is_remote("data:image/png;base64,AAAA") and not is_remote("iVBORw0KGgo=")
    assert ImageFetch.from_option(None) is None
    assert ImageFetch.from_option("public") == ImageFetch(allow_private=False)
    assert ImageFetch.from_option("private") == ImageFetch(allow_private=True)
    with pytest.raises(InvalidParameterError, match="public .* or private"):
        ImageFetch.from_option("everything")
