"""Prefix reuse and the KV tiers below the slots (issue #24), framework-free.

A new request's prompt may find its beginning already computed: in its own slot, in another slot
(copied), or in a tier (restored); with ``--cache-reuse``, chunks further on are moved into place
too. Everything here reaches the runner's cells through its public KV cache (``runner.kv_cache``,
backends/base.py's KVCache) and holds them as opaque snapshots.

- ``placement``: which slot a new request takes and where its cells come from; persisting, flush.
- ``chunk_reuse``: ``--cache-reuse``'s chunk matching and the splice it asks for.
- ``store``: what a tier is (``KVStore``); ``ram_tier`` a bounded LRU in host memory, spilling
  through ``spill_writer`` into ``disk_tier``, whose files ``disk_file`` reads and writes.
- ``tiers``: the tiers a session gives its engine, and how they are described.

The sizes come from above (budget/kv_tier.py: the RAM tier's share, the disk cap), and the
session wires them (runner_setup.build_kv_tiers): nothing here imports the budget.
"""
