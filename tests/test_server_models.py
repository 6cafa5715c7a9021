"""One server, several models (#25): a real server with the embedded SmolLM2 and tiny random GGUFs,
loaded on demand, evicted least recently used first under a memory limit, never under a request
in flight, unloaded when idle past the keep-alive, pinned, and driven by the load/unload routes.

Every server here runs `serve`'s own pool (ServeSupply + ModelPool), in-process on a real socket;
the memory limit is the budget's own figures for these models, so "fits only one" is exact.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from localinfer.engine.engine import Engine
from localinfer.errors import OutOfMemoryBudgetError
from localinfer.server import ServerThread, create_app
from localinfer.server.model_loading import LoadSettings, ServeSupply, named_source
from localinfer.server.model_pool import ModelPool, PoolSettings
from localinfer.server.pool_model import ModelSource
from localinfer.server.served_session import ServedSession
from tests.engine_gate import engine_held
from tests.model_files import tiny_checkpoint, write_gguf
from tests.serve_process import running_server
from tests.test_server_support import wait_until

SMOL = "smollm2-135m"
SETTINGS = LoadSettings(slots=1, ctx=256, models_from="local", options={"threads": 1})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two tiny random GGUFs (separate files: two models to the pool)."""
    folder = tmp_path_factory.mktemp("tiny-models")
    config, weights = tiny_checkpoint("llama")
    return tuple(str(write_gguf(folder / f"tiny-{n}.gguf", config, weights)) for n in "ab")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def needs(tiny: tuple[str, str]) -> dict[str, int]:
    """The budget of each model as the pool counts it."""
    supply = ServeSupply(SETTINGS)
    out = {}
    for name in (SMOL, *tiny):
        need = supply.need(named_source(supply, name))
        assert need is not None and need.bytes > 0
        out[name] = need.bytes
    return out


class Pool:
    """A served pool: its URL, the pool itself, and small helpers."""

    def __init__(self, url: str, pool: ModelPool, headers: dict[str, str]) -> None:
        self.url, self.pool, self.headers = url, pool, headers
        self.supply = pool.supply

    def models(self) -> dict[str, dict]:
        r = httpx.get(self.url + "/v1/models", headers=self.headers, timeout=60)
        assert r.status_code == 200, r.text
        return {card["id"]: card for card in r.json()["data"]}

    def idle(self, model_id: str) -> bool:
        """No request holds the model and its engine has nothing running (a request's lease is
        given back just after its last byte is sent)."""
        busy = httpx.get(self.url + "/health").json()["slots_busy"]
        return self.models()[model_id]["in_flight"] == 0 and busy == 0

    def state(self, model_id: str) -> str:
        return self.models()[model_id]["state"]

    def chat(self, model: str | None, **extra: object) -> httpx.Response:
        body: dict = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        body |= {"temperature": 0, **extra}
        if model is not None:
            body["model"] = model
        return httpx.post(
            self.url + "/v1/chat/completions", json=body, headers=self.headers, timeout=300
        )

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics").text


class GatedSupply(ServeSupply):
    """serve's supply, except that loading ``gated`` waits for ``gate``: a load held open."""

    def __init__(self, settings: LoadSettings, named: Sequence[str], gated: str) -> None:
        super().__init__(settings, named)
        self.gated, self.gate = gated, threading.Event()
        self.opened: Counter[str] = Counter()

    def open(self, source: ModelSource) -> ServedSession:
        self.opened[source.spec] += 1
        if source.spec == self.gated:
            self.gate.wait(300)
        return super().open(source)


@contextmanager
def served(
    start: Sequence[str],
    *,
    memory: int | None = None,
    keep_alive: float | None = None,
    wait: float = 120.0,
    pins: Sequence[str] = (),
    api_key: str | None = None,
    models_from: str = "local",
    gated: str | None = None,
) -> Iterator[Pool]:
    """`serve START... --device memory --keep-alive ... --pin ...` as its pool, on a socket."""
    settings = dataclasses.replace(SETTINGS, models_from=models_from, memory=memory)
    named = [*start, *pins]
    supply = GatedSupply(settings, named, gated) if gated else ServeSupply(settings, named)
    pool = ModelPool(supply, PoolSettings(keep_alive_s=keep_alive, wait_s=wait))
    sources = [named_source(supply, name) for name in start]
    pinned = [named_source(supply, name) for name in pins]
    app = create_app(pool=pool, start_up=lambda p: p.start(sources, pinned), api_key=api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with ServerThread(app) as server:
        wait_until(lambda: httpx.get(server.url + "/health").status_code != 503, 300, "start-up")
        assert httpx.get(server.url + "/health").json()["status"] == "ok"
        yield Pool(server.url, pool, headers)


def tiny_id(path: str) -> str:
    return Path(path).stem


# -- what a request may load, without a server -------------------------------------------------


def test_models_from_decides_what_a_request_may_load(tiny: tuple[str, str]) -> None:
    for allowed, path_ok, catalog_ok in [
        ("local", True, True), ("catalog", False, True), ("none", False, False)
    ]:  # fmt: skip
        supply = ServeSupply(LoadSettings(models_from=allowed))
        assert (supply.find(tiny[0]) is not None) == path_ok, allowed
        assert (supply.find("embedded") is not None) == catalog_ok, allowed
    named = ServeSupply(LoadSettings(models_from="none"), [tiny[0]])
    assert named.find(tiny[0]) is not None  # named on the command line: always
    assert ServeSupply(SETTINGS).find("no-such-model-anywhere") is None
    listed = ServeSupply(LoadSettings(models_from="catalog")).listed()
    assert SMOL in {s.id for s in listed}


# -- a real server -------------------------------------------------------------------------------


def test_on_demand_load_states_and_404(tiny: tuple[str, str]) -> None:
    with served([SMOL, "embedded"]) as s:  # two names of one model: one model, loaded once
        cards = s.models()
        assert cards[SMOL]["state"] == "loaded" and cards[SMOL]["budget_bytes"] > 0
        assert cards[SMOL]["object"] == "model" and cards[SMOL]["meta"]["slots"] == 1
        r = s.chat(tiny[0])  # a path: --models-from local
        assert r.status_code == 200, r.text
        assert r.json()["model"] == tiny_id(tiny[0])
        assert s.state(tiny_id(tiny[0])) == "loaded" and s.state(SMOL) == "loaded"
        assert s.chat(tiny_id(tiny[0])).status_code == 200  # its id selects it now
        default = s.chat(None)
        assert default.status_code == 200 and default.json()["model"] == SMOL
        assert s.chat("embedded").json()["model"] == SMOL  # the catalog's alias
        missing = s.chat("no-such-model")
        assert missing.status_code == 404, missing.text
        error = missing.json()["error"]
        assert error["code"] == "model_not_found" and "available:" in error["message"]
        assert SMOL in error["message"]
        metrics = s.metrics()
        assert f'localinfer_model_loaded{{model="{SMOL}"}} 1' in metrics
        assert f'localinfer_slots_total{{model="{tiny_id(tiny[0])}"}} 1' in metrics
        assert f'localinfer_model_loads_total{{model="{SMOL}"}} 1' in metrics
        health = httpx.get(s.url + "/health").json()
        assert health["status"] == "ok" and health["model"] == SMOL
        assert health["slots_total"] == 2


def test_other_models_serve_while_one_loads_once(tiny: tuple[str, str]) -> None:
    with served([SMOL], gated=tiny[0]) as s:
        answers: list[httpx.Response] = []
        waiting = [threading.Thread(target=lambda: answers.append(s.chat(tiny[0]))) for _ in "ab"]
        for thread in waiting:
            thread.start()
        wait_until(lambda: s.supply.opened[tiny[0]] == 1, 60, "the load to start")
        assert s.state(tiny_id(tiny[0])) == "loading"
        assert s.chat(SMOL).status_code == 200  # served while the other model loads
        assert httpx.get(s.url + "/health").json()["status"] == "ok"
        s.supply.gate.set()
        for thread in waiting:
            thread.join(300)
        assert [a.status_code for a in answers] == [200, 200]
        assert s.supply.opened[tiny[0]] == 1  # both requests waited for the one load
        assert f'localinfer_model_loads_total{{model="{tiny_id(tiny[0])}"}} 1' in s.metrics()


def test_lru_eviction_under_a_limit(tiny: tuple[str, str], needs: dict[str, int]) -> None:
    a, b = tiny
    limit = sum(needs.values()) - 1  # any two fit, never all three
    with served([SMOL], memory=limit) as s:
        assert s.chat(a).status_code == 200
        assert s.chat(SMOL).status_code == 200  # SmolLM2 is now the most recently used
        assert s.chat(b).status_code == 200  # one must go: the least recently used, a
        states = {k: v["state"] for k, v in s.models().items()}
        assert states[tiny_id(a)] == "available"
        assert states[SMOL] == "loaded" and states[tiny_id(b)] == "loaded"
        assert f'localinfer_model_unloads_total{{model="{tiny_id(a)}",reason="memory"}} 1' in (
            s.metrics()
        )
        assert s.chat(a).status_code == 200  # back on demand; SmolLM2 (used before b) goes
        assert s.state(SMOL) == "available" and s.state(tiny_id(b)) == "loaded"


def test_a_limit_that_fits_one_swaps_models(tiny: tuple[str, str], needs: dict[str, int]) -> None:
    limit = max(needs[SMOL], needs[tiny[0]]) + min(needs[SMOL], needs[tiny[0]]) // 2
    with served([SMOL], memory=limit) as s:
        assert s.chat(tiny[0]).status_code == 200
        assert s.state(SMOL) == "available"
        assert s.chat(SMOL).status_code == 200
        assert s.state(tiny_id(tiny[0])) == "available"


# A stream the test holds open with an EngineGate: its length only needs to outlast the gate.
STREAM_TOKENS = 8


def stream_chat(url: str, model: str, tokens: int) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count to a hundred."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    client = httpx.Client(timeout=300)
    request = client.build_request("POST", url + "/v1/chat/completions", json=body)
    return client.send(request, stream=True)


def finish_reason(lines: list[str]) -> str | None:
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    return next((r for r in reasons if r), None)


def engine_of(s: Pool, model_id: str) -> Engine:
    known = s.pool.find_known(model_id)
    assert known is not None and known.session is not None, f"{model_id} is not loaded"
    return known.session.engine


def test_no_eviction_under_an_in_flight_stream(
    tiny: tuple[str, str], needs: dict[str, int]
) -> None:
    limit = max(needs[SMOL], needs[tiny[0]]) + min(needs[SMOL], needs[tiny[0]]) // 2
    with served([SMOL], memory=limit, wait=0) as s:
        # The stream's engine waits after its first tokens: in flight while the test runs.
        with engine_held(engine_of(s, SMOL), free=2):
            stream = stream_chat(s.url, SMOL, STREAM_TOKENS)
            assert stream.status_code == 200
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            refused = s.chat(tiny[0])  # does not fit beside the streaming model, may not wait
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            error = refused.json()["error"]
            assert error["code"] == "memory_in_use" and "in flight" in error["message"]
        rest = [first[6:], *(line[6:] for line in lines if line.startswith("data: "))]
        stream.close()
        assert rest[-1] == "[DONE]" and finish_reason(rest) == "length"  # the stream completed
        wait_until(lambda: s.idle(SMOL), 60, "the stream's lease given back")
        # Idle now: SmolLM2 goes for it. With no waiting allowed the request that starts the
        # load is told to come back (503 model_loading); a retry finds it loaded.
        again = s.chat(tiny[0])
        if again.status_code != 200:
            assert again.json()["error"]["code"] == "model_loading", again.text
            wait_until(lambda: s.chat(tiny[0]).status_code == 200, 120, "the load")
        assert s.state(SMOL) == "available"


def test_a_waiting_request_loads_once_the_stream_ends(
    tiny: tuple[str, str], needs: dict[str, int]
) -> None:
    limit = max(needs[SMOL], needs[tiny[0]]) + min(needs[SMOL], needs[tiny[0]]) // 2
    with served([SMOL], memory=limit, wait=300) as s:
        answers: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answers.append(s.chat(tiny[0])))
        with engine_held(engine_of(s, SMOL), free=2):
            stream = stream_chat(s.url, SMOL, STREAM_TOKENS)
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            waiter.start()
            wait_until(lambda: s.pool.find_known(tiny[0]) is not None, 60, "the request")
            assert s.state(SMOL) == "loaded"  # not unloaded under the stream
        rest = [first[6:], *(line[6:] for line in lines if line.startswith("data: "))]
        stream.close()
        waiter.join(300)
        assert finish_reason(rest) == "length" and rest[-1] == "[DONE]"
        assert answers and answers[0].status_code == 200, answers and answers[0].text
        assert s.state(SMOL) == "available" and s.state(tiny_id(tiny[0])) == "loaded"


def test_keep_alive_unloads_idle_on_demand_models(tiny: tuple[str, str]) -> None:
    with served([SMOL], keep_alive=0.2) as s:
        assert s.chat(tiny[0]).status_code == 200
        wait_until(lambda: s.state(tiny_id(tiny[0])) == "available", 60, "keep-alive expiry")
        assert s.state(SMOL) == "loaded"  # named at start: kept
        metrics = s.metrics()
        assert f'model_unloads_total{{model="{tiny_id(tiny[0])}",reason="keep_alive"}} 1' in metrics
        assert s.chat(tiny[0]).status_code == 200  # loads again on demand


def test_pinned_models_are_never_evicted(tiny: tuple[str, str], needs: dict[str, int]) -> None:
    a, b = tiny
    limit = sum(needs.values()) - 1  # any two fit
    with served([SMOL], memory=limit, pins=[SMOL]) as s:
        assert s.chat(a).status_code == 200
        assert s.chat(b).status_code == 200  # SmolLM2 is least recently used, but pinned
        assert s.state(SMOL) == "loaded" and s.state(tiny_id(a)) == "available"
        assert s.models()[SMOL]["pinned"] is True
    fits_one = max(needs[SMOL], needs[a]) + min(needs[SMOL], needs[a]) // 2
    with served([SMOL], memory=fits_one, pins=[SMOL]) as s:
        refused = s.chat(a)
        assert refused.status_code == 507, refused.text
        message = refused.json()["error"]["message"]
        assert "pinned models hold" in message and SMOL in message


def test_load_and_unload_routes(tiny: tuple[str, str]) -> None:
    with served([SMOL], api_key="k3y", pins=[SMOL]) as s:
        tid = tiny_id(tiny[0])
        assert httpx.post(s.url + f"/v1/models/{tiny[0]}/load").status_code == 401
        r = httpx.post(s.url + f"/v1/models/{tiny[0]}/load", headers=s.headers, timeout=300)
        assert r.status_code == 200 and r.json()["state"] == "loaded", r.text
        assert r.json()["id"] == tid and s.state(tid) == "loaded"
        assert httpx.post(s.url + f"/v1/models/{tid}/unload").status_code == 401
        r = httpx.post(s.url + f"/v1/models/{tid}/unload", headers=s.headers, timeout=300)
        assert r.status_code == 200 and r.json()["state"] == "available", r.text
        r = httpx.post(s.url + f"/v1/models/{SMOL}/unload", headers=s.headers)
        assert r.status_code == 409 and "pinned" in r.json()["error"]["message"]
        r = httpx.post(s.url + "/v1/models/no-such-model/load", headers=s.headers)
        assert r.status_code == 404
        assert httpx.get(s.url + f"/v1/models/{tid}", headers=s.headers).json()["state"] == (
            "available"
        )


def test_start_up_models_that_do_not_fit_together_stop_the_server(
    tiny: tuple[str, str], needs: dict[str, int]
) -> None:
    settings = dataclasses.replace(SETTINGS, memory=needs[SMOL])
    supply = ServeSupply(settings, [SMOL, tiny[0]])
    pool = ModelPool(supply, PoolSettings(keep_alive_s=None))
    sources = [named_source(supply, name) for name in (SMOL, tiny[0])]
    app = create_app(pool=pool, start_up=lambda p: p.start(sources))
    with ServerThread(app) as server:
        wait_until(lambda: httpx.get(server.url + "/health").status_code != 503, 300)
        health = httpx.get(server.url + "/health")
        assert health.status_code == 500 and "do not fit together" in health.json()["error"]
    assert isinstance(app.state.localinfer.load_exception, OutOfMemoryBudgetError)


@pytest.mark.usefixtures("private_cache")
def test_serve_command_with_two_models(tiny: tuple[str, str]) -> None:
    args = [SMOL, tiny[0], "--port", "0", "--slots", "1", "--ctx", "256", "--threads", "1"]
    args += ["--models-from", "none", "--keep-alive", "-1"]
    with running_server(args, "serve with two models") as url:
        cards = {c["id"]: c for c in httpx.get(url + "/v1/models").json()["data"]}
        assert set(cards) == {SMOL, tiny_id(tiny[0])}
        assert all(card["state"] == "loaded" for card in cards.values())
        r = httpx.post(
            url + "/v1/completions",
            json={"model": tiny_id(tiny[0]), "prompt": "a", "max_tokens": 2},
            timeout=300,
        )
        assert r.status_code == 200 and r.json()["model"] == tiny_id(tiny[0])
        missing = httpx.post(url + "/v1/completions", json={"model": tiny[1], "prompt": "a"})
        assert missing.status_code == 404  # --models-from none: only the named ones
