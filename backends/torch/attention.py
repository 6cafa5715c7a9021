"""Attention of packed tokens against the static cache, one SDPA call per attention group, or per
run of a decode group.

Grouped-query attention is handled without copying K/V: the ``heads / kv_heads`` query heads that
share a KV head are folded into the query-length dimension, so queries are
``[span, kv_heads, group * q_len, head_dim]`` and keys/values are plain views of the cache
``[span, kv_heads, kv_len, head_dim]``. A group covers the span of slots ``[lo, hi)`` its members
touch (idle slots between them included), so those views are plain slices of the cache.

A decode group (one query token per member) needs no mask at all when it is cut into runs of
members in consecutive slots that read the same number of keys: each query sits at the last
position of its keys, so causality holds by the view's end, and a sliding window by the view's
start. Without a mask, SDPA on CUDA can take its flash kernel, which a boolean mask rules out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localinfer.backends.ragged_batch import PackedBatch, PackedGroup

# A decode group cut into more runs than this (streams at many different lengths) keeps the one
# masked call: each run is its own SDPA launch plus a few views, and past a handful of them the
# launches cost the host more than the flash kernel saves the device. A guess: not measured on
# a GPU yet.
MAX_DECODE_RUNS = 8


@dataclass(slots=True, frozen=True)
class DecodeRun:
    """Members of a decode group in consecutive slots ``[lo, hi)`` with the same ``kv_len``:
    their queries are packed tokens ``[token_start, token_end)``, one per slot."""

    token_start: int
    token_end: int
    lo: int
    hi: int
    kv_len: int
    window_start: int  # the first key a sliding-window layer reads (0 without a window)


@dataclass(slots=True)
class GroupTensors:
    """Device-side index and masks of one attention group, built once per forward; or, for a
    mask-free decode group, its runs (``runs`` set, the masks None)."""

    group: PackedGroup
    lo: int  # the group's queries are padded to [hi - lo, q_len]: one row per slot of the span
    hi: int
    flat_rows: torch.Tensor | None  # [Tg] long: each token's padded row; None when dense
    mask_full: torch.Tensor | None  # [span, 1, group * q_len, kv_len] bool
    mask_sliding: torch.Tensor | None  # same shape, for sliding-window layers
    runs: tuple[DecodeRun, ...] | None = None

    @property
    def span(self) -> int:
        return self.hi - self.lo


def decode_runs(group: PackedGroup, sliding_window: int | None) -> tuple[DecodeRun, ...] | None:
    """The runs of a decode group (every member one token), else None."""
    if group.q_len != 1:
        return None
    runs: list[DecodeRun] = []
    for m, work in enumerate(group.members):
        token, kv_len = group.token_start + m, work.start_pos + 1
        last = runs[-1] if runs else None
        if last is not None and last.hi == work.slot and last.kv_len == kv_len:
            runs[-1] = DecodeRun(
                last.token_start, token + 1, last.lo, work.slot + 1, kv_len, last.window_start
            )
            continue
        start = 0 if sliding_window is None else max(0, kv_len - sliding_window)
        runs.append(DecodeRun(token, token + 1, work.slot, work.slot + 1, kv_len, start))
    return tuple(runs)


def build_groups(
    packed: PackedBatch,
    q_per_kv: int,
    sliding_window: int | None,
    device: torch.device,
    mask_free: bool = True,
) -> list[GroupTensors]:
    """Each group's tensors; ``mask_free`` False masks decode groups too (the reference the
    mask-free runs are tested against)."""
    out = []
    for g in packed.groups:
        lo, hi = g.members[0].slot, g.members[-1].slot + 1
        runs = decode_runs(g, sliding_window) if mask_free else None
        if runs is not None and len(runs) <= MAX_DECODE_RUNS:
            out.append(GroupTensors(g, lo, hi, None, None, None, runs))
            continue
        out.append(_masked_group(g, lo, hi, q_per_kv, sliding_window, device))
    return out


def _masked_group(
    g: PackedGroup,
    lo: int,
    hi: int,
    q_per_kv: int,
    sliding_window: int | None,
    device: torch.device,
) -> GroupTensors:
    rows = [slot - lo for slot in g.slots]
    # [span, q_len]; -1 in padding rows (slots of the span not in the group, short items)
    pos = torch.from_numpy(g.padded_positions(rows, hi - lo)).to(device)
    keys = torch.arange(g.kv_len, device=device)  # [kv_len]
    causal = keys <= pos[..., None]  # [span, q_len, kv_len]; padding rows (-1) see nothing
    # Padding rows must still see one key, or softmax over nothing gives NaN; their output
    # is discarded.
    padding = (pos < 0)[..., None] & (keys == 0)
    mask_full = _fold(causal | padding, q_per_kv)
    mask_sliding = None
    if sliding_window is not None:
        in_window = (pos[..., None] - keys) < sliding_window
        mask_sliding = _fold((causal & in_window) | padding, q_per_kv)
    flat_rows = g.padded_rows(rows)
    flat = None
    if len(flat_rows) != (hi - lo) * g.q_len:  # not dense: tokens scatter into padding
        flat = torch.from_numpy(flat_rows).to(device)
    return GroupTensors(g, lo, hi, flat, mask_full, mask_sliding)


def _fold(mask: torch.Tensor, q_per_kv: int) -> torch.Tensor:
    """[span, q_len, kv_len] -> [span, 1, q_per_kv * q_len, kv_len]; row = i * q_len + t."""
    span, q_len, kv_len = mask.shape
    expanded = mask[:, None, None].expand(span, 1, q_per_kv, q_len, kv_len)
    return expanded.reshape(span, 1, q_per_kv * q_len, kv_len)


def grouped_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    groups: list[GroupTensors],
    sliding: bool,
) -> torch.Tensor:
    """q: [T, heads, head_dim] (RoPE applied); keys/values: one layer's cache
    [slots, kv_heads, max_ctx, head_dim] with this forward's entries already written.
    Returns [T, heads * head_dim] in packed token order."""
    outs: list[torch.Tensor] = []
    for gt in groups:
        if gt.runs is not None:
            outs.extend(_run_attention(q, keys, values, run, sliding) for run in gt.runs)
        else:
            outs.append(_group_attention(q, keys, values, gt, sliding))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _run_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, run: DecodeRun, sliding: bool
) -> torch.Tensor:
    """One decode run, no mask: [n, heads * head_dim]."""
    n, heads, head_dim = run.token_end - run.token_start, q.shape[1], q.shape[2]
    kv_heads = keys.shape[1]
    # One query per slot: heads ordered kv_head * q_per_kv + i fold into the query rows as-is.
    qr = q[run.token_start : run.token_end].view(n, kv_heads, heads // kv_heads, head_dim)
    start = run.window_start if sliding else 0
    k = keys[run.lo : run.hi, :, start : run.kv_len]  # [n, kv_heads, keys read, d] (a view)
    v = values[run.lo : run.hi, :, start : run.kv_len]
    o = F.scaled_dot_product_attention(qr, k, v)  # [n, kv_heads, q_per_kv, d]
    return o.reshape(n, heads * head_dim)


def _group_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, gt: GroupTensors, sliding: bool
) -> torch.Tensor:
    """One group with its mask: [Tg, heads * head_dim]."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = keys.shape[1]
    q_per_kv = heads // kv_heads
    g = gt.group
    span, q_len = gt.span, g.q_len
    qg = q[g.token_start : g.token_end]  # [Tg, heads, head_dim]
    if gt.flat_rows is not None:
        padded = qg.new_zeros(span * q_len, heads, head_dim)
        padded[gt.flat_rows] = qg
        qg = padded
    # [span*q_len, heads, d] -> [span, kv_heads, q_per_kv * q_len, d]
    qg = qg.view(span, q_len, kv_heads, q_per_kv, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(span, kv_heads, q_per_kv * q_len, head_dim)
    k = keys[gt.lo : gt.hi, :, : g.kv_len]  # [span, kv_heads, kv_len, d] (a view)
    v = values[gt.lo : gt.hi, :, : g.kv_len]
    mask = gt.mask_sliding if sliding and gt.mask_sliding is not None else gt.mask_full
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)  # like qg
    # back to [span*q_len, heads*d], heads ordered kv_head * q_per_kv + i as in q
    o = o.view(span, kv_heads, q_per_kv, q_len, head_dim).permute(0, 3, 1, 2, 4)
    o = o.reshape(span * q_len, heads * head_dim)
    if gt.flat_rows is not None:
        o = o[gt.flat_rows]
    return o
