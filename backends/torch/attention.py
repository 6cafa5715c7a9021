"""Attention of packed tokens against the static cache, one SDPA call per attention group.

Grouped-query attention is handled without copying K/V: the ``heads / kv_heads`` query heads that
share a KV head are folded into the query-length dimension, so queries are
``[span, kv_heads, group * q_len, head_dim]`` and keys/values are plain views of the cache
``[span, kv_heads, kv_len, head_dim]``. A group covers the span of slots ``[lo, hi)`` its members
touch (idle slots between them included), so those views are plain slices of the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localinfer.backends.ragged_batch import PackedBatch, PackedGroup


@dataclass(slots=True)
class GroupTensors:
    """Device-side index and masks of one attention group, built once per forward."""

    group: PackedGroup
    lo: int  # the group's queries are padded to [hi - lo, q_len]: one row per slot of the span
    hi: int
    flat_rows: torch.Tensor | None  # [Tg] long: each token's padded row; None when dense
    mask_full: torch.Tensor  # [span, 1, group * q_len, kv_len] bool
    mask_sliding: torch.Tensor | None  # same shape, for sliding-window layers

    @property
    def span(self) -> int:
        return self.hi - self.lo


def build_groups(
    packed: PackedBatch, q_per_kv: int, sliding_window: int | None, device: torch.device
) -> list[GroupTensors]:
    out = []
    for g in packed.groups:
        lo, hi = g.members[0].slot, g.members[-1].slot + 1
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
        out.append(GroupTensors(g, lo, hi, flat, mask_full, mask_sliding))
    return out


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
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = keys.shape[1]
    q_per_kv = heads // kv_heads
    outs = []
    for gt in groups:
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
        outs.append(o)
    return outs[0] if len(outs) == 1 else torch.cat(outs)
