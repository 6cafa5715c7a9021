"""One step's forward, with the failure of one request kept from failing the others.

When the batched forward raises, each slot is run alone (its runner slot first put back to the
length the engine expects), so only the request that caused the error gets it. A slot that fed
speculative tokens and still fails is retried once with its last sampled token alone: a proposal
must never fail a request that plain decoding would serve.
"""

from __future__ import annotations

import logging

import numpy as np

from localinfer.backends.base import Runner, SlotWork
from localinfer.engine.batch_plan import PlannedWork

log = logging.getLogger(__name__)


def forward_each_isolated(
    runner: Runner, planned: list[PlannedWork]
) -> list[np.ndarray | Exception]:
    """Logits per planned item, in order, or the exception that item's forward raised.

    An item retried without its proposal has ``proposal`` and ``work`` replaced in place."""
    batch = [p.work for p in planned]
    try:
        return list(runner.forward(batch))
    except Exception as exc:  # noqa: BLE001 - isolate the request that caused it
        if len(batch) == 1 and planned[0].proposal is None:
            return [exc]
        log.warning("batched forward failed (%s); retrying slot by slot", exc)
    return [_forward_alone(runner, item) for item in planned]


def _forward_alone(runner: Runner, item: PlannedWork) -> np.ndarray | Exception:
    try:
        resync_slot(runner, item.work.slot, item.work.start_pos)
        return runner.forward([item.work])[0]
    except Exception as exc:  # noqa: BLE001
        if item.proposal is None:
            return exc
    item.proposal = None
    item.work = SlotWork(item.work.slot, item.work.tokens[:1], item.work.start_pos)
    try:
        resync_slot(runner, item.work.slot, item.work.start_pos)
        return runner.forward([item.work])[0]
    except Exception as exc:  # noqa: BLE001
        return exc


def resync_slot(runner: Runner, slot: int, length: int) -> None:
    """After a failed forward, put the runner's slot back to the length the engine expects."""
    have = runner.slot_length(slot)
    if have > length:
        runner.truncate(slot, length)
    elif have < length:
        raise RuntimeError(f"slot {slot} lost cached tokens ({have} < {length})")
