"""GET /metrics: Prometheus text exposition (format 0.0.4) without a client library.

Counters and gauges come from the engine's own snapshot (``Engine.metrics()``), so the server and
the TUI never disagree. Histograms need every observation, and the engine keeps only a window of
recent latencies, so the server observes each finished request's RequestMetrics here.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from localinfer.engine.types import EngineMetrics, RequestMetrics

# Latency buckets in seconds: fine near the interactive range, coarse in the tail.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

PREFIX = "localinfer"


class Histogram:
    """Cumulative buckets with Prometheus semantics: ``le`` bounds, ``+Inf``, sum, count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append(f'{name}_bucket{{le="{_num(bound)}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


def _num(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value)) + ".0"


class ServerMetrics:
    """Observations the server makes itself: per-request latencies and HTTP outcomes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.http_errors: Counter[tuple[int, str]] = Counter()  # (status, code)
        self.disconnects = 0

    def observe_request(self, metrics: RequestMetrics | None) -> None:
        if metrics is None:
            return
        with self._lock:
            if metrics.ttft_s is not None:
                self.ttft.observe(metrics.ttft_s)
            if metrics.tpot_s is not None:
                self.tpot.observe(metrics.tpot_s)

    def count_error(self, status: int, code: str | None) -> None:
        with self._lock:
            self.http_errors[(status, code or "")] += 1

    def count_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1

    def render(self, engine: EngineMetrics | None, model: str) -> str:
        """The whole exposition for one model (engine figures unlabelled); ``engine`` is None
        while the model is still loading."""
        loaded = [f'{PREFIX}_model_loaded{{model="{_escape(model)}"}} {0 if engine is None else 1}']
        engines = [("", engine)] if engine is not None else []
        return self._exposition(loaded, [], engines)

    def render_models(self, models: Sequence[ModelSample]) -> str:
        """The whole exposition for a pool of models: each one's state and budget, and each
        loaded one's engine figures, labelled ``model``."""
        loaded = []
        pool: list[str] = []
        engines = []
        for s in models:
            label = f'model="{_escape(s.model)}"'
            loaded.append(f"{PREFIX}_model_loaded{{{label}}} {1 if s.state == 'loaded' else 0}")
            if s.engine is not None:
                engines.append((label, s.engine))
        pool += _family(
            "model_state",
            "gauge",
            "1 for the state each model is in (available, loading, loaded, unloading).",
            [(f'model="{_escape(s.model)}",state="{s.state}"', 1) for s in models],
        )
        budgeted = [s for s in models if s.budget_bytes is not None]
        pool += _family(
            "model_budget_bytes",
            "gauge",
            "The budget's memory for each model at its slots x ctx.",
            [(f'model="{_escape(s.model)}"', s.budget_bytes or 0) for s in budgeted],
        )
        pool += _family(
            "model_requests_in_flight",
            "gauge",
            "Requests holding each model (it is never unloaded under them).",
            [(f'model="{_escape(s.model)}"', s.in_flight) for s in models],
        )
        pool += _family(
            "model_loads_total",
            "counter",
            "Loads of each model.",
            [(f'model="{_escape(s.model)}"', s.loads) for s in models],
        )
        unloads = [
            (f'model="{_escape(s.model)}",reason="{_escape(reason)}"', n)
            for s in models
            for reason, n in sorted(s.unloads.items())
        ]
        pool += _family(
            "model_unloads_total",
            "counter",
            "Unloads of each model by reason (memory, keep_alive, request, shutdown).",
            unloads,
        )
        return self._exposition(loaded, pool, engines)

    def _exposition(
        self,
        loaded: list[str],
        pool: list[str],
        engines: Sequence[tuple[str, EngineMetrics]],
    ) -> str:
        m: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            m.append(f"# HELP {PREFIX}_{name} {help_text}")
            m.append(f"# TYPE {PREFIX}_{name} {kind}")
            m.extend(samples)

        metric("model_loaded", "gauge", "1 once the model is loaded and serving.", loaded)
        m.extend(pool)
        with self._lock:
            metric(
                "time_to_first_token_seconds",
                "histogram",
                "Submit to first generated token, per finished request.",
                self.ttft.lines(f"{PREFIX}_time_to_first_token_seconds"),
            )
            metric(
                "time_per_output_token_seconds",
                "histogram",
                "Mean time per output token after the first, per finished request.",
                self.tpot.lines(f"{PREFIX}_time_per_output_token_seconds"),
            )
            errors = sorted(self.http_errors.items())
            disconnects = self.disconnects
        metric(
            "http_errors_total",
            "counter",
            "Error responses by HTTP status and error code.",
            [
                f'{PREFIX}_http_errors_total{{status="{s}",code="{_escape(c)}"}} {n}'
                for (s, c), n in errors
            ],
        )
        metric(
            "client_disconnects_total",
            "counter",
            "Requests aborted because the client went away.",
            [f"{PREFIX}_client_disconnects_total {disconnects}"],
        )
        if engines:
            m.extend(_engine_lines(engines))
        return "\n".join(m) + "\n"


@dataclass(frozen=True, slots=True)
class ModelSample:
    """One pool model as /metrics shows it."""

    model: str
    state: str  # available | loading | loaded | unloading
    engine: EngineMetrics | None  # None unless loaded
    budget_bytes: int | None
    in_flight: int
    loads: int
    unloads: Mapping[str, int]


def _family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    """One metric's HELP, TYPE and samples (``labels`` without braces; "" for none)."""
    lines = [f"# HELP {PREFIX}_{name} {help_text}", f"# TYPE {PREFIX}_{name} {kind}"]
    for labels, value in samples:
        braced = f"{{{labels}}}" if labels else ""
        lines.append(f"{PREFIX}_{name}{braced} {value}")
    return lines


def _engine_lines(engines: Sequence[tuple[str, EngineMetrics]]) -> list[str]:
    """The engine figures of each (labels, snapshot): labels "" for a lone unlabelled model."""
    m: list[str] = []

    def one(name: str, kind: str, help_text: str, value: Callable[[EngineMetrics], float]) -> None:
        m.extend(_family(name, kind, help_text, [(labels, value(e)) for labels, e in engines]))

    one(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of finished requests.",
        lambda e: e.prompt_tokens_total,
    )
    one(
        "completion_tokens_total",
        "counter",
        "Generated tokens of finished requests.",
        lambda e: e.completion_tokens_total,
    )
    one(
        "cached_prompt_tokens_total",
        "counter",
        "Prompt tokens reused from a slot's cache.",
        lambda e: e.cached_prompt_tokens_total,
    )
    one(
        "prefix_hits_total",
        "counter",
        "Requests that reused a cached prefix.",
        lambda e: e.prefix_hits,
    )
    m.extend(_kv_tier_lines(engines))
    reasons = _by_label(
        engines, "finish_reason", ("stop", "length", "abort", "error"), lambda e: e.finish_reasons
    )
    m.extend(_family("requests_total", "counter", "Finished requests by finish reason.", reasons))
    one(
        "slots_total",
        "gauge",
        "Sequence slots (concurrent requests the engine runs).",
        lambda e: e.slots_total,
    )
    one("slots_busy", "gauge", "Slots running a request now.", lambda e: e.slots_busy)
    one("queue_depth", "gauge", "Requests waiting for a slot.", lambda e: e.queue_depth)
    one("kv_cache_cells_used", "gauge", "KV cache cells holding tokens.", lambda e: e.kv_cells_used)
    one("kv_cache_cells_total", "gauge", "KV cache cells allocated.", lambda e: e.kv_cells_total)
    one(
        "kv_cache_usage_ratio",
        "gauge",
        "Fraction of KV cache cells in use.",
        lambda e: round(e.kv_cells_used / e.kv_cells_total if e.kv_cells_total else 0.0, 6),
    )
    one("engine_steps_total", "counter", "Engine scheduler steps run.", lambda e: e.steps)
    one(
        "spec_proposed_tokens_total",
        "counter",
        "Speculative tokens proposed.",
        lambda e: e.spec_proposed,
    )
    one(
        "spec_accepted_tokens_total",
        "counter",
        "Speculative tokens accepted.",
        lambda e: e.spec_accepted,
    )
    one(
        "spec_acceptance_ratio",
        "gauge",
        "Accepted / proposed speculative tokens.",
        lambda e: round(e.spec_accepted / e.spec_proposed if e.spec_proposed else 0.0, 6),
    )
    return m


def _kv_tier_lines(engines: Sequence[tuple[str, EngineMetrics]]) -> list[str]:
    """Where reused prompt tokens came from (slot, copy, ram, disk) and the KV tiers' state."""
    sources = _by_label(
        engines, "source", ("slot", "copy", "ram", "disk"), lambda e: e.reused_tokens_by_source
    )
    return [
        *_family(
            "reused_prompt_tokens_total",
            "counter",
            "Prompt tokens not prefilled, by where their KV came from (slot, copy, ram, disk).",
            sources,
        ),
        *_family(
            "kv_transfer_failures_total",
            "counter",
            "KV copies and restores that failed and fell back to a cold prefill.",
            [(labels, e.kv_transfer_failures) for labels, e in engines],
        ),
        *_family(
            "kv_ram_tier_bytes",
            "gauge",
            "Bytes the host-RAM KV tier holds.",
            [(labels, e.kv_ram_bytes) for labels, e in engines],
        ),
    ]


def _by_label(
    engines: Sequence[tuple[str, EngineMetrics]],
    label: str,
    always: Sequence[str],
    counts_of: Callable[[EngineMetrics], Mapping[str, int]],
) -> list[tuple[str, float]]:
    """One sample per value of ``label`` per engine (the ``always`` values even at 0), after the
    engine's own labels."""
    samples: list[tuple[str, float]] = []
    for labels, e in engines:
        counts = {**dict.fromkeys(always, 0), **counts_of(e)}
        for value, n in sorted(counts.items()):
            both = ",".join(x for x in (labels, f'{label}="{_escape(value)}"') if x)
            samples.append((both, n))
    return samples


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
