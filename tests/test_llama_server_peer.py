"""scripts/bench-llama-server: llama.cpp's C++ llama-server built from the installed
llama-cpp-python's sources (bench/llama_server.py) and started with the runner's settings
(bench/peer_servers.py), the side-by-side table (bench/llama_server_peer.py), and raw-text
/v1/completions in the load generator. Everything from given inputs: no build, no download; the
real build and run is the `slow` test at the end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from bench import llama_server, llamacpp_avx2
from bench.llama_server_peer import Row, run_ratio, runner_repacks, table
from bench.peer_servers import llama_server_command
from localinfer.bench.prompts import BenchPrompt
from localinfer.bench.records import LevelResult, RequestRecord
from localinfer.bench.targets import HttpTarget


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(llama_server, "dev_cache", lambda: tmp_path)
    return tmp_path


def test_each_version_and_variant_has_its_own_build_folder(cache: Path) -> None:
    native = llama_server.build_dir("0.3.36", "native")
    assert native.parent == cache and native.name.startswith("llama-server-native-0.3.36-")
    assert llama_server.build_dir("0.3.37", "native") != native
    avx2 = llama_server.build_dir("0.3.36", "avx2")
    assert avx2 != native and avx2.name.startswith("llama-server-avx2-0.3.36-")
    assert llamacpp_avx2.CMAKE_ARGS in llama_server.cmake_args("avx2")  # the laptop flags
    assert "-DLLAMA_CURL=OFF" in llama_server.cmake_args("native").split()
    with pytest.raises(ValueError, match="unknown llama-server variant"):
        llama_server.build_dir("0.3.36", "avx512")


def test_other_flags_are_another_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = llama_server.build_dir("0.3.36", "native")
    monkeypatch.setitem(llama_server.VARIANTS, "native", "-DGGML_NATIVE=ON -DGGML_X=ON")
    assert llama_server.build_dir("0.3.36", "native") != before


def test_a_build_counts_only_with_its_marker_and_binary(tmp_path: Path) -> None:
    assert not llama_server.is_built(tmp_path, "0.3.36", "native")
    (tmp_path / llama_server.MARKER).write_text(llama_server.marker_text("0.3.36", "native"))
    assert not llama_server.is_built(tmp_path, "0.3.36", "native")  # no binary: unfinished
    (tmp_path / llama_server.BINARY).write_bytes(b"")
    assert llama_server.is_built(tmp_path, "0.3.36", "native")
    assert not llama_server.is_built(tmp_path, "0.3.35", "native")
    assert not llama_server.is_built(tmp_path, "0.3.36", "avx2")
    assert llama_server.build_seconds(tmp_path) is None
    (tmp_path / llama_server.SECONDS).write_text("312.5\n")
    assert llama_server.build_seconds(tmp_path) == 312.5


def test_a_finished_build_is_found_without_building(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_server, "installed_version", lambda: "0.3.36")
    folder = llama_server.build_dir("0.3.36", "avx2")
    folder.mkdir()
    (folder / llama_server.BINARY).write_bytes(b"")
    (folder / llama_server.MARKER).write_text(llama_server.marker_text("0.3.36", "avx2"))
    assert llama_server.ensure_built("avx2", log=pytest.fail) == folder / "llama-server"


def test_no_installed_package_is_a_build_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_server, "installed_version", lambda: None)
    with pytest.raises(llama_server.BuildFailed, match="not installed"):
        llama_server.ensure_built("native", log=print)


def test_the_peer_starts_with_the_runners_settings() -> None:
    cmd = llama_server_command(Path("/b/llama-server"), Path("/m/x.gguf"), port=8081, threads=4,
                               slots=8, ctx=1024, no_repack=True)  # fmt: skip
    assert cmd[0] == "/b/llama-server"
    assert cmd[cmd.index("-m") + 1] == "/m/x.gguf" and cmd[cmd.index("--port") + 1] == "8081"
    assert cmd[cmd.index("-t") + 1] == "4" and cmd[cmd.index("-tb") + 1] == "4"
    assert cmd[cmd.index("-np") + 1] == "8" and "-cb" in cmd
    assert cmd[cmd.index("-c") + 1] == str(8 * 1024)  # the total: 1024 cells per slot
    assert "--no-kv-unified" in cmd and "--no-repack" in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    repacking = llama_server_command(Path("b"), Path("m"), port=1, threads=2, slots=1, ctx=256,
                                     no_repack=False, extra=["-fa", "off"])  # fmt: skip
    assert "--no-repack" not in repacking and repacking[-2:] == ["-fa", "off"]


def test_no_repack_follows_the_runners_own_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    from localinfer.backends.llamacpp import native

    monkeypatch.delenv(native.AMX_ENV, raising=False)
    monkeypatch.setattr(native, "has_amx", lambda: True)
    assert runner_repacks(avx2=False) is False  # AMX: the runner turns extra buffers off
    assert runner_repacks(avx2=True) is True  # the AVX2 build has no AMX kernels
    monkeypatch.setenv(native.AMX_ENV, "1")
    assert runner_repacks(avx2=False) is True
    monkeypatch.setattr(native, "has_amx", lambda: False)
    monkeypatch.delenv(native.AMX_ENV)
    assert runner_repacks(avx2=False) is True


def level(concurrency: int, wall: float, tokens: list[int], ttft: float = 0.05) -> LevelResult:
    records = [RequestRecord(f"p{i}", True, 1.0, ttft, 0.9, n) for i, n in enumerate(tokens)]
    return LevelResult(concurrency, wall, records)


def test_the_table_gives_ratios_to_llama_server_and_answers_cut_short() -> None:
    peer, ours = Row(), Row()
    peer.add(level(1, 2.0, [8, 8]), max_tokens=8)  # 8 tok/s
    ours.add(level(1, 4.0, [8, 4], ttft=0.1), max_tokens=8)  # 3 tok/s, one answer cut short
    ours.add(LevelResult(1, 1.0, [RequestRecord("x", False, 0.5, error="HTTP 500")]), 8)
    assert ours.short == 2 and ours.requests == 3 and ours.tps == [3.0, 0.0]
    lines = table({"llama-server": {1: peer}, "localinfer (llamacpp)": {1: ours}},
                  {"localinfer (torch)": "file type Q4_K_M not supported"}, [1])  # fmt: skip
    assert "tok/s" in lines[0] and "cut short" in lines[0]
    peer_line, our_line, failed_line = lines[1:]
    assert "1.00x" in peer_line and peer_line.rstrip().endswith("0/2")
    assert " 1.5 " in our_line and "0.19x" in our_line  # median of 3.0 and 0.0; 1.5 / 8
    assert "2.00x" in our_line and our_line.rstrip().endswith("2/3")  # TTFT p50 100 ms / 50
    assert "by run" in lines[0] and " 0.38x " in our_line  # the one run both have: 3 / 8
    assert "did not start: file type Q4_K_M not supported" in failed_line


def test_the_run_ratio_is_the_median_of_each_runs_own_ratio() -> None:
    """Runs at a full, a half and a tenth of the speed, with 0.9x, 1.1x and 0.95x in each."""
    peer, ours = Row(), Row()
    for speed, ours_vs_peer in ((1.0, 0.9), (0.5, 1.1), (0.1, 0.95)):
        peer.add(level(1, 1.0 / speed, [100]), max_tokens=100)
        ours.add(level(1, 1.0 / (ours_vs_peer * speed), [100]), max_tokens=100)
    assert run_ratio(ours, peer) == "0.95x"
    assert run_ratio(Row(), peer) == "n/a"


def test_completions_send_the_messages_as_raw_text() -> None:
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        events = [{"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in "ab"]
        events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(),
                              headers={"content-type": "text/event-stream"})  # fmt: skip

    prompt = BenchPrompt("p", "short", ({"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"}))  # fmt: skip
    target = HttpTarget("http://b.test", model="m", completions=True,
                        transport=httpx.MockTransport(handler))  # fmt: skip
    record = asyncio.run(target.run(prompt, 2))
    path, body = seen[0]
    assert path == "/v1/completions" and body["prompt"] == "Be brief.\n\nHi"
    assert "messages" not in body and body["temperature"] == 0
    assert record.ok and record.output_tokens == 2 and record.token_source == "chunks"


@pytest.mark.slow
@pytest.mark.llamacpp
def test_the_real_build_serves_the_embedded_model_beside_localinfer(tmp_path: Path) -> None:
    """Builds llama-server (minutes, once per machine) and runs the whole bench for a moment."""
    pytest.importorskip("llama_cpp")
    from bench.llama_server_peer import main

    out = tmp_path / "figures.json"
    argv = ["--clients", "1", "--requests", "1", "--max-tokens", "4", "--sizes", "short",
            "--backends", "llamacpp", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    for name in ("llama-server", "localinfer (llamacpp)"):
        assert doc["servers"][name]["1"]["cut_short"] == 0, name


def test_the_peer_threads_wait_as_the_runners_unless_told_or_the_user_chose() -> None:
    from bench.llama_server_peer import peer_env
    from localinfer.backends.llamacpp.omp_wait import DEFAULT_POLICY, DEFAULT_SPINCOUNT

    spin = {"GOMP_SPINCOUNT": str(DEFAULT_SPINCOUNT), "OMP_WAIT_POLICY": DEFAULT_POLICY}
    assert peer_env({"A": "1"}, runner_wait=True) == {"A": "1", **spin}
    assert peer_env({"A": "1"}, runner_wait=False) == {"A": "1"}  # libgomp's default
    assert peer_env({"OMP_WAIT_POLICY": "active"}, runner_wait=True) == {
        "OMP_WAIT_POLICY": "active"
    }
    assert peer_env({"GOMP_SPINCOUNT": "5"}, runner_wait=True) == {"GOMP_SPINCOUNT": "5"}


def test_a_backend_variant_sets_the_spin_or_the_sampler_for_that_server_alone() -> None:
    from bench.llama_server_peer import server_variant
    from localinfer.session import SAMPLING_ENV

    assert server_variant("llamacpp", None) == ("llamacpp", None, "localinfer (llamacpp)")
    assert server_variant("torch", {"A": "1"})[1] == {"A": "1"}
    backend, env, name = server_variant("llamacpp:spin3000", {"A": "1"})
    assert (backend, name) == ("llamacpp", "localinfer (llamacpp, spin 3000)")
    assert env == {"A": "1", "GOMP_SPINCOUNT": "3000", "OMP_WAIT_POLICY": "ACTIVE"}
    _, env, name = server_variant("llamacpp:host", {"A": "1"})
    assert env == {"A": "1", SAMPLING_ENV: "host"} and name.endswith("host sampling)")
    for bad in ("llamacpp:spin", "llamacpp:spinx", "llamacpp:fast"):
        with pytest.raises(SystemExit, match="unknown variant"):
            server_variant(bad, None)
