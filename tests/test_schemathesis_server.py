"""schemathesis against the app, in-process (#44): requests generated from the server's own
/openapi.json, seeded and bounded, with every check schemathesis has.

The server is `serve`'s pool (--models-from catalog) with the embedded model, as `localinfer
serve` runs it by default; requests go through the ASGI app without a socket. scripts/fuzz-server
runs the same checks longer against a live `localinfer serve`.

Two tests: the checks this issue made hold everywhere (no 5xx, every status and content type
documented, error bodies as documented, 405s with the right Allow header, schema-violating
bodies refused) at a small budget; and the whole set, positive-data acceptance included, at the
issue's budget. Both are marked slow. A schema-valid body is still refused (400) for the few
rules no JSON Schema can state (a tool result must answer an earlier call, tool names are
unique, a token id must be in the model's vocabulary...): tests/schemathesis_hooks.py drops
exactly those failures, each by the refusal the server writes, and counts them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

schemathesis = pytest.importorskip("schemathesis")

from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import events, from_schema  # noqa: E402
from schemathesis.engine.statistic import Statistic  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from localinfer.server import create_app  # noqa: E402
from localinfer.server.model_loading import LoadSettings, ServeSupply, named_source  # noqa: E402
from localinfer.server.model_pool import ModelPool, PoolSettings  # noqa: E402
from tests.schemathesis_hooks import unstatable  # noqa: E402 - registers its filter_failure

SEED = 1
# Checks that need no judgement about what a body means: each failure is a server bug.
STRICT_CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "unsupported_method",
    "negative_data_rejection",
]


@pytest.fixture(scope="module")
def app() -> Iterator[object]:
    settings = LoadSettings(slots=2, ctx=2048, models_from="catalog", options={"threads": 1})
    supply = ServeSupply(settings, ["embedded"])
    pool = ModelPool(supply, PoolSettings(keep_alive_s=None, wait_s=30))
    sources = [named_source(supply, "embedded")]
    # schemathesis' ASGI client sends Host: testserver, which the Host guard would refuse.
    built = create_app(pool=pool, start_up=lambda p: p.start(sources), allowed_hosts=["testserver"])
    with TestClient(built) as client:  # runs the lifespan: the model loads
        deadline = time.monotonic() + 300  # only stops a broken start-up from hanging
        while client.get("/health").status_code == 503:
            assert time.monotonic() < deadline, "the embedded model did not load"
            time.sleep(0.05)
        assert client.get("/health").json()["status"] == "ok"
        yield built


def run(app: object, checks: list[str], max_examples: int) -> Statistic:
    """One seeded schemathesis run; its failures, grouped as the CLI reports them."""
    config = SchemathesisConfig()
    config.update(seed=SEED, max_failures=None)
    config.projects.override.checks.update(included_check_names=checks)
    # No example database: nothing is written into the working tree.
    config.projects.override.generation.update(max_examples=max_examples, database="none")
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    statistic = Statistic()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished) and event.is_test_scenario:
            statistic.on_scenario_finished(event.recorder)
        assert not isinstance(event, events.FatalError), event.exception
    return statistic


def failures(statistic: Statistic) -> list[str]:
    return [
        f"{label}: {failure.title}: {(failure.message or '').splitlines()[:2]}"
        for label, grouped in statistic.failures.items()
        for group in grouped.values()
        for failure in group.failures
    ]


@pytest.mark.slow  # about 100 s on two shared cores, the model's load included
def test_no_server_error_and_the_document_holds(app: object) -> None:
    statistic = run(app, STRICT_CHECKS, max_examples=5)
    assert statistic.total_cases > 200  # every operation was exercised
    assert failures(statistic) == []


@pytest.mark.slow
def test_every_check_at_the_issues_budget(app: object) -> None:
    statistic = run(app, ["all"], max_examples=30)
    assert statistic.total_cases > 1000
    assert failures(statistic) == []
    print(f"{statistic.filtered_failures} refusals for rules no JSON Schema can state dropped")


def test_only_the_unstatable_refusals_are_dropped() -> None:
    def refused(message: str, status: int = 400, anthropic: bool = False) -> str | None:
        error = {"type": "invalid_request_error", "message": message}
        body = {"type": "error", "error": error} if anthropic else {"error": error}
        return unstatable(status, json.dumps(body).encode())

    assert refused("messages[1].tool_call_id: no earlier tool call has the id 'x'")
    assert refused("messages[0].role: the last message must be a user message", anthropic=True)
    assert refused("input[0]: token id 70000 is outside the vocabulary (0..49151)")
    assert refused("model 'embedded' is not a reranker: its file declares no rank pooling")
    assert refused("n: Input should be less than or equal to 1") is None  # the document says it
    assert refused("seed: Input should be greater than or equal to -9223372036854775808")
    assert refused("duplicate tool name 'f'", status=404) is None  # only 400s
    assert unstatable(400, b"not json") is None
