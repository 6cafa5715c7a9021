"""A fake Hugging Face Hub on 127.0.0.1: the endpoints huggingface_hub 2.x calls to download.

    with FakeHub() as hub:                         # listens on a free port
        hub.add_file("org/repo", "model.gguf", data)
        env = {"HF_ENDPOINT": hub.url, ...}        # huggingface_hub reads HF_ENDPOINT at import

Served (the shapes huggingface_hub parses, checked against its 2.4 source):

* ``GET /api/models/{repo}[/revision/{rev}]`` - model_info / repo_info: ``id``, ``sha`` and
  ``siblings`` (with ``size`` and ``lfs`` when ``?blobs=true``, as files_metadata asks).
* ``GET /api/models/{repo}/tree/{rev}`` - list_repo_tree (snapshot_download): files with
  ``oid``, ``size`` and ``lfs``; one page (no ``Link`` header).
* ``HEAD|GET /{repo}/resolve/{rev}/{path}`` - ``X-Repo-Commit``, ``ETag`` (the sha256, as for
  LFS files), ``Content-Length``, ``Accept-Ranges``; GET honours ``Range: bytes=N-`` and
  ``bytes=N-M`` with 206 (what a resumed download and a header read over HTTP send:
  parse_safetensors_file_metadata asks for ``bytes=0-100000``, the GGUF reader for the header).
* Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) so
  huggingface_hub raises its typed errors.

``gate(repo)`` makes a repo gated, as the Hub does: its info says ``gated`` and its files answer
401 GatedRepo unless the request carries ``Authorization: Bearer {GATE_TOKEN}``.

``drop_once(repo, path, after)`` makes the next download of that file (a GET of the whole file or
of ``bytes=N-``; header reads ask for ``bytes=N-M``) send its full Content-Length, then only
``after`` bytes, then close the connection: an interrupted download.
``stall_once(repo, path, after)`` makes the next download send ``after`` bytes and then wait until
the returned event is set before sending the rest: a download in progress for as long as a test
needs.
Every request is logged in ``hub.requests`` (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_INFO = re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
GATE_TOKEN = "hf_fake_token_for_gated_repos"


@dataclass
class FakeRepo:
    commit: str
    files: dict[str, bytes] = field(default_factory=dict)
    gated: bool = False


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[Logged] = []
        self._drops: dict[tuple[str, str], int] = {}
        self._stalls: dict[tuple[str, str], tuple[int, threading.Event]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, each teardown.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_file(self, repo_id: str, path: str, data: bytes) -> None:
        repo = self.repos.setdefault(repo_id, FakeRepo(hashlib.sha1(repo_id.encode()).hexdigest()))
        repo.files[path] = data

    def gate(self, repo_id: str) -> None:
        self.repos[repo_id].gated = True

    def drop_once(self, repo_id: str, path: str, after: int) -> None:
        self._drops[(repo_id, path)] = after

    def take_drop(self, repo_id: str, path: str) -> int | None:
        with self._lock:
            return self._drops.pop((repo_id, path), None)

    def stall_once(self, repo_id: str, path: str, after: int) -> threading.Event:
        release = threading.Event()
        with self._lock:
            self._stalls[(repo_id, path)] = (after, release)
        return release

    def take_stall(self, repo_id: str, path: str) -> tuple[int, threading.Event] | None:
        with self._lock:
            return self._stalls.pop((repo_id, path), None)

    def log(self, entry: Logged) -> None:
        with self._lock:
            self.requests.append(entry)

    def file_gets(self, path: str) -> list[Logged]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + path)]

    def bytes_sent(self, path: str) -> int:
        """Bytes of ``path`` the GETs so far asked for (a whole-file GET counts the file)."""
        total = 0
        for request in self.file_gets(path):
            data = next((r.files[path] for r in self.repos.values() if path in r.files), b"")
            start, end = _span(request.range, len(data))
            total += max(0, end - start)
        return total

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _span(wanted: str | None, size: int) -> tuple[int, int]:
    """[start, end) of a Range header over a file of ``size`` bytes (the whole file if none)."""
    found = _RANGE.match(wanted.strip()) if wanted else None
    if found is None:
        return 0, size
    end = int(found[2]) + 1 if found[2] else size
    return int(found[1]), min(end, size)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # quiet: the test log is hub.requests

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(head=True)

        def do_GET(self) -> None:  # noqa: N802
            self._route(head=False)

        # -- routing --------------------------------------------------------------------

        def _route(self, head: bool) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            query = parse_qs(parts.query)
            hub.log(Logged(self.command, path, self.headers.get("Range")))
            if match := _TREE.match(path):
                return self._tree(match["repo"], unquote(match["rev"]))
            if match := _INFO.match(path):
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                return self._info(match["repo"], unquote(match["rev"] or "main"), blobs)
            if match := _RESOLVE.match(path):
                return self._resolve(match["repo"], unquote(match["rev"]), match["path"], head)
            self._error(404, "RepoNotFound", "no such route")

        def _repo(self, repo_id: str, rev: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
                return None
            if rev not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return repo

        def _info(self, repo_id: str, rev: str, blobs: bool) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            siblings = []
            for name, data in sorted(repo.files.items()):
                sibling: dict[str, object] = {"rfilename": name}
                if blobs:
                    sibling["size"] = len(data)
                    sibling["blobId"] = hashlib.sha1(data).hexdigest()
                    sibling["lfs"] = {
                        "size": len(data),
                        "sha256": _sha256(data),
                        "pointerSize": 134,
                    }
                siblings.append(sibling)
            self._json(
                {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": repo.commit,
                    "gated": "manual" if repo.gated else False,
                    "siblings": siblings,
                }
            )

        def _tree(self, repo_id: str, rev: str) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            entries = [
                {
                    "type": "file",
                    "oid": hashlib.sha1(data).hexdigest(),
                    "size": len(data),
                    "path": name,
                    "lfs": {"oid": _sha256(data), "size": len(data), "pointerSize": 134},
                }
                for name, data in sorted(repo.files.items())
            ]
            self._json(entries)

        def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            if repo.gated and self.headers.get("Authorization") != f"Bearer {GATE_TOKEN}":
                message = f"Access to model {repo_id} is restricted. You must have access to it"
                self._error(401, "GatedRepo", message, commit=repo.commit)
                return
            data = repo.files.get(path)
            if data is None:
                self._error(404, "EntryNotFound", f"{path} does not exist", commit=repo.commit)
                return
            start, end = 0, len(data)
            status = 200
            wanted = self.headers.get("Range")
            if wanted and not head:
                found = _RANGE.match(wanted.strip())
                if found is None or int(found[1]) >= len(data):
                    self._error(416, None, "bad range")
                    return
                start, end = _span(wanted, len(data))
                status = 206
            body = data[start:end]
            self.send_response(status)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{_sha256(data)}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            ranged = _RANGE.match(wanted.strip()) if wanted else None
            if ranged is not None and ranged[2]:  # a header read (bytes=N-M), not a download
                self.wfile.write(body)
                return
            drop = hub.take_drop(repo_id, path)
            if drop is not None:
                # Promise the whole body, send part of it, hang up: a dropped connection.
                self.wfile.write(body[:drop])
                self.wfile.flush()
                self.close_connection = True
                return
            stall = hub.take_stall(repo_id, path)
            if stall is not None:
                after, release = stall
                self.wfile.write(body[:after])
                self.wfile.flush()
                release.wait(timeout=300)
                try:
                    self.wfile.write(body[after:])
                except OSError:  # the client is gone (killed, or timed out and retried)
                    self.close_connection = True
                return
            self.wfile.write(body)

        # -- responses ------------------------------------------------------------------

        def _json(self, payload: object) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str | None, message: str, commit: str = "") -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler
