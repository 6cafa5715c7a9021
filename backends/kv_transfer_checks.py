"""What every runner's KV cache (``KVTransfer``, backends/base.py) checks before it touches a slot,
and how its layout key is spelled. Framework-free: torch, MLX and llama.cpp share it."""

from __future__ import annotations

import hashlib
from dataclasses import astuple

from localinfer.backends.base import KVSnapshot
from localinfer.backends.slot_lengths import SlotLengths
from localinfer.loading.model_config import ModelConfig


def model_identity(config: ModelConfig, fingerprint: bytes = b"") -> str:
    """A short hash of the model's hyper-parameters and ``fingerprint`` (bytes of a weight the
    runner holds, so two fine-tunes of one architecture differ), prefixed by the vocabulary
    size. Not the model file's hash: the engine adds that where a snapshot leaves the process."""
    digest = hashlib.sha256(repr(astuple(config)).encode())
    digest.update(fingerprint)
    return f"vocab{config.vocab_size}-{digest.hexdigest()[:12]}"


def layout_key(backend: str, **fields: object) -> str:
    """``backend;name=value;...`` in the order given: the string ``KVSnapshot.layout`` holds."""
    return ";".join([backend, *(f"{name}={value}" for name, value in fields.items())])


def check_copy(lengths: SlotLengths, src: int, dst: int, n_tokens: int) -> None:
    """``copy_prefix``'s arguments: two distinct slots, ``1 <= n_tokens <= length(src)``."""
    held = lengths.checked(src)
    lengths.checked(dst)
    if src == dst:
        raise ValueError(f"copy_prefix: source and destination are both slot {src}")
    if not 1 <= n_tokens <= held:
        raise ValueError(f"copy_prefix: slot {src} holds {held} tokens, cannot copy {n_tokens}")


def check_snapshot(lengths: SlotLengths, slot: int, n_tokens: int) -> None:
    """``snapshot``'s arguments: ``1 <= n_tokens <= length(slot)``."""
    held = lengths.checked(slot)
    if not 1 <= n_tokens <= held:
        raise ValueError(f"snapshot: slot {slot} holds {held} tokens, cannot take {n_tokens}")


def check_restore(
    lengths: SlotLengths,
    slot: int,
    snapshot: KVSnapshot,
    layout: str,
    max_ctx: int,
    payload_bytes: int | None,
) -> None:
    """``restore``'s arguments: a slot the runner has, a snapshot of this layout that fits the
    slot, and (where the runner knows it from the layout: ``payload_bytes``) a payload of
    exactly that many bytes."""
    lengths.checked(slot)
    if snapshot.layout != layout:
        raise ValueError(
            f"restore: snapshot layout {snapshot.layout!r} does not match this runner's {layout!r}"
        )
    if snapshot.n_tokens > max_ctx:
        raise ValueError(f"restore: snapshot of {snapshot.n_tokens} tokens > max_ctx {max_ctx}")
    if payload_bytes is not None and snapshot.nbytes != payload_bytes:
        raise ValueError(
            f"restore: payload of {snapshot.nbytes} bytes, {snapshot.n_tokens} tokens of this "
            f"layout take {payload_bytes}"
        )
