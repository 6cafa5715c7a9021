"""`localinfer bench`: a load generator for OpenAI-compatible servers and for the engine itself.

prompts (the shipped prompt set) -> targets (one streamed request: HTTP or in-process) ->
loadgen (closed-loop concurrency levels) -> records/stats (TTFT, TPOT, latency percentiles,
throughput) -> render (rich table) and plot (PNG).

The benchmark scripts' own harness (scripts/bench-*) lives in the top-level bench/ folder, which
is not installed.
"""
