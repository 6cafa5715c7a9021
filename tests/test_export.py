"""`localinfer export --to vllm|llama-server|ollama` (localinfer/handoff.py): the launch plans
carry the budget's numbers and the model id clients used. The llama-server plan is started for
real in the `slow` test at the end (it builds llama-server from the vendored sources)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from localinfer.budget.model_facts import model_facts
from localinfer.budget.plan import vllm_plan_for
from localinfer.errors import InvalidParameterError
from localinfer.facts.kv_dtype import kv_dtype
from localinfer.handoff import ExportRequest, export_plan
from localinfer.loading import embedded_model_path
from localinfer.resolve import resolve_model

pytestmark = pytest.mark.usefixtures("session_cache")

# The flags `vllm serve` documents (its engine arguments and the OpenAI server's tool and
# reasoning options), with the values it documents where it lists them: what the plan may use.
VLLM_FLAGS = {
    "--served-model-name": None,
    "--host": None,
    "--port": None,
    "--tensor-parallel-size": None,
    "--pipeline-parallel-size": None,
    "--max-model-len": None,
    "--max-num-seqs": None,
    "--gpu-memory-utilization": None,
    "--kv-cache-dtype": {"auto", "fp8", "fp8_e5m2", "fp8_e4m3"},
    "--enable-auto-tool-choice": None,
    "--tool-call-parser": {"hermes", "llama3_json", "mistral", "pythonic"},
    "--reasoning-parser": {"deepseek_r1", "qwen3", "granite"},
    "--speculative-config": None,
    "--tokenizer": None,
}
VALUELESS = {"--enable-auto-tool-choice"}


def flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        if argv[i] in VALUELESS:
            out[argv[i]], i = None, i + 1
        else:
            out[argv[i]], i = argv[i + 1], i + 2
    return out


def test_vllm_uses_only_documented_flags_and_the_budgets_parallel_sizes() -> None:
    plan = export_plan(ExportRequest("qwen3-8b", "vllm", ctx=32768, concurrency=8))
    assert plan.command[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]  # the original weights
    given = flags(plan.command[3:])
    for flag, value in given.items():
        assert flag in VLLM_FLAGS, flag
        allowed = VLLM_FLAGS[flag]
        assert allowed is None or value in allowed, (flag, value)
    expected = vllm_plan_for(model_facts(resolve_model("qwen3-8b")), 32768, 8, kv_dtype("f16"))
    assert expected is not None
    assert given["--tensor-parallel-size"] == str(expected.tensor_parallel_size)
    assert given["--max-model-len"] == "32768" and given["--max-num-seqs"] == "8"
    assert given["--served-model-name"] == "qwen3-8b"  # the id localinfer serve gives it
    assert given["--tool-call-parser"] == "hermes" and given["--reasoning-parser"] == "qwen3"
    assert plan.base_url == "http://127.0.0.1:8000/v1"


def test_a_model_too_big_for_one_gpu_gets_pipeline_stages_and_fp8_cache() -> None:
    plan = export_plan(ExportRequest("qwen3-30b-a3b", "vllm", ctx=131072 // 4, concurrency=64,
                                     kv_dtype="q8_0", alias="big", draft="ngram"))  # fmt: skip
    given = flags(plan.command[3:])
    assert given["--kv-cache-dtype"] == "fp8"  # a quantized llama.cpp cache maps to fp8
    expected = vllm_plan_for(
        model_facts(resolve_model("qwen3-30b-a3b")), 32768, 64, kv_dtype("q8_0")
    )
    assert expected is not None
    assert given["--tensor-parallel-size"] == str(expected.tensor_parallel_size)
    stages = expected.pipeline_parallel_size
    assert given.get("--pipeline-parallel-size", "1") == str(stages)
    assert given["--served-model-name"] == "big"
    spec = given.get("--speculative-config")
    if stages == 1:
        assert json.loads(spec or "{}")["method"] == "ngram"
    else:
        assert spec is None and any("pipeline" in n for n in plan.notes)


def test_vllm_speculation_from_ngram_and_a_catalog_draft() -> None:
    plan = export_plan(ExportRequest("qwen3-8b", "vllm", draft="ngram"))
    spec = json.loads(flags(plan.command[3:])["--speculative-config"] or "")
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] > 0
    drafted = export_plan(ExportRequest("smollm2-360m", "vllm", draft="auto"))
    spec = json.loads(flags(drafted.command[3:])["--speculative-config"] or "")
    assert spec["model"].endswith(".gguf")  # the catalog draft is the embedded GGUF


def test_llama_server_holds_every_slot_its_context_and_the_alias() -> None:
    plan = export_plan(ExportRequest("smollm2-135m", "llama-server", ctx=1024, concurrency=3,
                                     kv_dtype="q8_0", alias="my-model", port=9000))  # fmt: skip
    argv = plan.command
    assert argv[0] == "llama-server" and Path(argv[argv.index("-m") + 1]).is_file()
    assert argv[argv.index("-c") + 1] == "3072" and argv[argv.index("-np") + 1] == "3"
    assert argv[argv.index("--alias") + 1] == "my-model" and "--no-kv-unified" in argv
    assert argv[argv.index("-ctk") + 1] == "q8_0" and argv[argv.index("-fa") + 1] == "on"
    assert plan.base_url == "http://127.0.0.1:9000/v1" and "--reasoning-format" not in argv
    assert "--spec-type" not in argv  # no --draft
    ngram = export_plan(ExportRequest("smollm2-135m", "llama-server", draft="ngram")).command
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-simple"


def test_ollama_writes_a_modelfile_and_creates_the_alias_once_the_server_runs() -> None:
    plan = export_plan(ExportRequest("smollm2-135m", "ollama", ctx=4096, concurrency=2,
                                     kv_dtype="q4_0"))  # fmt: skip
    assert plan.files["Modelfile"].splitlines() == [
        f"FROM {embedded_model_path()}",
        "PARAMETER num_ctx 4096",
    ]
    assert plan.env["OLLAMA_NUM_PARALLEL"] == "2" and plan.env["OLLAMA_KV_CACHE_TYPE"] == "q4_0"
    script = plan.shell().splitlines()
    serve = script.index("ollama serve &")
    create = script.index("ollama create smollm2-135m -f Modelfile")
    assert serve < create and script[-1] == 'wait "$server"'
    assert plan.base_url == "http://127.0.0.1:11434/v1"


def test_an_unknown_target_and_a_missing_draft_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="unknown export target"):
        export_plan(ExportRequest("smollm2-135m", "exo"))
    with pytest.raises(InvalidParameterError, match="no catalog draft"):
        export_plan(ExportRequest("smollm2-135m", "vllm", draft="auto"))


def test_the_command_prints_a_script_and_json() -> None:
    run = [sys.executable, "-m", "localinfer", "export", "smollm2-135m", "--to", "llama-server"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True)
    last = done.stdout.strip().splitlines()[-1]
    assert shlex.split(last)[0] == "llama-server"
    assert "base_url=http://127.0.0.1:8080/v1 model=smollm2-135m" in done.stderr
    as_json = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120,
                             check=True)  # fmt: skip
    assert json.loads(as_json.stdout)["alias"] == "smollm2-135m"


@pytest.mark.slow
@pytest.mark.llamacpp
def test_the_llama_server_export_starts_a_server_that_answers_by_the_alias() -> None:
    """Builds llama-server from the vendored sources when no build is there (minutes, once)."""
    pytest.importorskip("llama_cpp")
    from bench import llama_server
    from bench.llama_server_peer import runner_repacks
    from localinfer.server.host import free_port
    from tests.test_server_support import wait_until

    variant = next((v for v in ("avx2", "native") if _built(llama_server, v)), "native")
    binary = llama_server.ensure_built(variant, log=print)
    port = free_port()
    plan = export_plan(ExportRequest("smollm2-135m", "llama-server", ctx=512, concurrency=2,
                                     alias="exported", port=port))  # fmt: skip
    argv = [str(binary), *plan.command[1:], "-t", "1"]
    if not runner_repacks(avx2=variant == "avx2"):
        argv.append("--no-repack")  # as the runner keeps weights out of AMX buffers here
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _healthy(plan.base_url), timeout=120, what="llama-server /health")
        body = {"model": "exported", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]}  # fmt: skip
        answer = httpx.post(plan.base_url + "/chat/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["message"]["content"].strip()
        models = httpx.get(plan.base_url + "/models", timeout=10).json()
        assert "exported" in [m["id"] for m in models["data"]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _built(module: object, variant: str) -> bool:
    from bench.llamacpp_source import installed_version

    version = installed_version()
    folder = module.build_dir(version, variant)  # type: ignore[attr-defined]
    return version is not None and module.is_built(folder, version, variant)  # type: ignore[attr-defined]


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(base_url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
