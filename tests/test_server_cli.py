"""`localinfer serve` as a real process: loading -> ok, answers the openai client, stops on
Ctrl-C; mistakes are one line and exit 1."""

from __future__ import annotations

import io
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr

import httpx
import openai
import pytest

from localinfer.cli import main as cli_main
from localinfer.commands import serve as serve_command
from tests.serve_process import SERVE, read_port
from tests.test_server_support import wait_until


def test_serve_loads_answers_and_stops_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [
            *SERVE,
            "--port",
            "0",
            "--slots",
            "2",
            "--ctx",
            "256",
            "--threads",
            "1",
            "--api-key",
            "k1",
            "--allowed-host",
            "box.lan",
            "--max-body-size",
            "1MiB",
            "--log-level",
            "warning",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{read_port(proc)}"
        statuses: list[str] = []

        def healthy() -> bool:
            try:
                statuses.append(httpx.get(url + "/health").json()["status"])
            except httpx.TransportError:
                return False
            return statuses[-1] == "ok"

        wait_until(healthy, timeout=120, what="/health to say ok")
        assert set(statuses) <= {"loading", "ok"}
        client = openai.OpenAI(base_url=url + "/v1", api_key="k1", max_retries=0)
        # The loaded one (bundled models installed here are listed as available beside it).
        (model,) = [m for m in client.models.list().data if m.model_extra["state"] == "loaded"]
        for name in (model.id, "smollm2-135m", "default"):
            reply = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
            assert reply.usage.completion_tokens <= 2
        # The flags reach the server: the Host rule with its extra name, the body limit.
        auth = {"Authorization": "Bearer k1"}
        forged = httpx.get(url + "/v1/models", headers={**auth, "Host": "evil.example"})
        assert forged.status_code == 403 and forged.json()["error"]["code"] == "host_not_allowed"
        assert httpx.get(url + "/v1/models", headers={**auth, "Host": "box.lan"}).status_code == 200
        big = httpx.post(
            url + "/v1/completions", headers=auth, json={"prompt": "x" * 2_000_000}, timeout=60
        )
        assert big.status_code == 413 and "1048576 bytes" in big.json()["error"]["message"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unknown_model_is_one_line_and_exit_1() -> None:
    done = subprocess.run(
        [*SERVE, "no-such-model-anywhere", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        line for line in done.stderr.strip().splitlines() if line.startswith("localinfer: error:")
    ]
    assert "no-such-model-anywhere" in done.stderr and "Traceback" not in done.stderr


def test_busy_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*SERVE, "--port", str(port)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Run ``serve`` with settings it must refuse before loading anything; its stderr.

    In-process through the CLI's own ``main`` (argv to exit code and stderr): a refusal is
    decided there, and a process per case only added a Python start-up. The process itself (one
    line, exit 1, no traceback) is tested above on the unknown model and the busy port."""
    with pytest.MonkeyPatch.context() as patch, _captured_stderr() as stderr:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        # A setting that is not refused would go on to listen and serve forever: fail instead.
        patch.setattr(serve_command, "_bind", _must_not_bind)
        code = cli_main(["serve", *args, "--port", "0"])
    err = stderr.getvalue()
    assert code == 1, err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("localinfer: error:")
    return line


def _must_not_bind(host: str, port: int) -> socket.socket:
    raise AssertionError(f"serve went on to listen on {host}:{port}: nothing was refused")


@contextmanager
def _captured_stderr() -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    with redirect_stderr(buffer):
        yield buffer


def test_an_empty_api_key_is_refused_not_taken_as_no_key() -> None:
    assert "--api-key is empty" in refused("--api-key", "")
    assert "--api-key is empty" in refused("--api-key", "  ")
    assert "LOCALINFER_API_KEY is set but empty" in refused(env={"LOCALINFER_API_KEY": ""})


def test_turning_the_host_check_off_needs_a_key() -> None:
    line = refused("--allowed-host", "*")
    assert "--allowed-host '*'" in line and "--api-key" in line
    assert "not a host name" in refused("--allowed-host", "a b:c")


def test_bad_limits_are_refused() -> None:
    assert "--max-body-size" in refused("--max-body-size", "lots")
    assert "--header-timeout" in refused("--header-timeout", "0")
    assert "--body-timeout" in refused("--body-timeout", "nan")
