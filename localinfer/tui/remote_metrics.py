"""The engine figures of a `localinfer serve` process, read back from its Prometheus ``/metrics``.

The chat's engine panel shows slots, queue and KV cells (and speculation when on): the same
:class:`EngineMetrics` a local session reports, rebuilt from the samples the server renders
(localinfer/server/prometheus.py). A server with several models labels samples by model: the
chat's own model's samples are taken, unlabelled ones otherwise. Anything missing: None.
"""

from __future__ import annotations

import re

from localinfer.engine.types import EngineMetrics

PREFIX = "localinfer_"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<v>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# EngineMetrics field <- sample name (without the prefix); the first group is required.
_REQUIRED = {
    "slots_total": "slots_total",
    "slots_busy": "slots_busy",
    "queue_depth": "queue_depth",
    "kv_cells_used": "kv_cache_cells_used",
    "kv_cells_total": "kv_cache_cells_total",
}
_OPTIONAL = {
    "prompt_tokens_total": "prompt_tokens_total",
    "completion_tokens_total": "completion_tokens_total",
    "spec_proposed": "spec_proposed_tokens_total",
    "spec_accepted": "spec_accepted_tokens_total",
    "cached_prompt_tokens_total": "cached_prompt_tokens_total",
    "prefix_hits": "prefix_hits_total",
}


def _samples(text: str, model: str | None) -> dict[str, float]:
    """name -> value for the model's samples (or unlabelled ones); label sets other than
    ``model`` (finish reasons) are left out."""
    mine: dict[str, float] = {}
    plain: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match["name"].startswith(PREFIX):
            continue
        try:
            value = float(match["v"])
        except ValueError:
            continue
        name = match["name"][len(PREFIX) :]
        labels = dict(_LABEL.findall(match["labels"] or ""))
        if not labels:
            plain[name] = value
        elif set(labels) == {"model"} and labels["model"] == model:
            mine[name] = value
    return {**plain, **mine}


def engine_metrics_from(text: str, model: str | None = None) -> EngineMetrics | None:
    """The engine snapshot in a ``/metrics`` page, or None when the page lacks its gauges."""
    samples = _samples(text, model)
    if any(name not in samples for name in _REQUIRED.values()):
        return None
    # Finished requests and their token totals are not shown by the chat: zero where unsaid.
    values = {"requests_finished": 0, "prompt_tokens_total": 0, "completion_tokens_total": 0}
    values.update({field: int(samples[name]) for field, name in _REQUIRED.items()})
    values.update({f: int(samples[n]) for f, n in _OPTIONAL.items() if n in samples})
    return EngineMetrics(**values)
