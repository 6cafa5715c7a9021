"""GET /metrics: Prometheus text exposition (format 0.0.4) without a client library.

Counters and gauges come from the engine's own snapshot (``Engine.metrics()``), so the server and
the TUI never disagree. Histograms need every observation, and the engine keeps only a window of
recent latencies, so the server observes each finished request's RequestMetrics here.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Sequence

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
        """The whole exposition; ``engine`` is None while the model is still loading."""
        m: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            m.append(f"# HELP {PREFIX}_{name} {help_text}")
            m.append(f"# TYPE {PREFIX}_{name} {kind}")
            m.extend(samples)

        label = f'model="{_escape(model)}"'
        metric(
            "model_loaded",
            "gauge",
            "1 once the model is loaded and serving.",
            [f"{PREFIX}_model_loaded{{{label}}} {0 if engine is None else 1}"],
        )
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
        if engine is not None:
            m.extend(_engine_lines(engine))
        return "\n".join(m) + "\n"


def _engine_lines(e: EngineMetrics) -> list[str]:
    m: list[str] = []

    def one(name: str, kind: str, help_text: str, value: float | int) -> None:
        m.append(f"# HELP {PREFIX}_{name} {help_text}")
        m.append(f"# TYPE {PREFIX}_{name} {kind}")
        m.append(f"{PREFIX}_{name} {value}")

    one(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of finished requests.",
        e.prompt_tokens_total,
    )
    one(
        "completion_tokens_total",
        "counter",
        "Generated tokens of finished requests.",
        e.completion_tokens_total,
    )
    one(
        "cached_prompt_tokens_total",
        "counter",
        "Prompt tokens reused from a slot's cache.",
        e.cached_prompt_tokens_total,
    )
    one("prefix_hits_total", "counter", "Requests that reused a cached prefix.", e.prefix_hits)
    m.append(f"# HELP {PREFIX}_requests_total Finished requests by finish reason.")
    m.append(f"# TYPE {PREFIX}_requests_total counter")
    reasons = {"stop": 0, "length": 0, "abort": 0, "error": 0, **e.finish_reasons}
    for reason, n in sorted(reasons.items()):
        m.append(f'{PREFIX}_requests_total{{finish_reason="{_escape(reason)}"}} {n}')
    one(
        "slots_total",
        "gauge",
        "Sequence slots (concurrent requests the engine runs).",
        e.slots_total,
    )
    one("slots_busy", "gauge", "Slots running a request now.", e.slots_busy)
    one("queue_depth", "gauge", "Requests waiting for a slot.", e.queue_depth)
    one("kv_cache_cells_used", "gauge", "KV cache cells holding tokens.", e.kv_cells_used)
    one("kv_cache_cells_total", "gauge", "KV cache cells allocated.", e.kv_cells_total)
    usage = e.kv_cells_used / e.kv_cells_total if e.kv_cells_total else 0.0
    one("kv_cache_usage_ratio", "gauge", "Fraction of KV cache cells in use.", round(usage, 6))
    one("engine_steps_total", "counter", "Engine scheduler steps run.", e.steps)
    one("spec_proposed_tokens_total", "counter", "Speculative tokens proposed.", e.spec_proposed)
    one("spec_accepted_tokens_total", "counter", "Speculative tokens accepted.", e.spec_accepted)
    rate = e.spec_accepted / e.spec_proposed if e.spec_proposed else 0.0
    one("spec_acceptance_ratio", "gauge", "Accepted / proposed speculative tokens.", round(rate, 6))
    return m


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
