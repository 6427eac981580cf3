"""Cascade attention over a shared cached prefix (CPU): decode rows, and prompt chunks.

When a step's decode rows start with the same cache blocks (a system prompt per tenant, one
few-shot preamble, the 64 continuations of one document), the paged kernel reads those
blocks once per row: 64 rows over a 1,024-token shared prefix read the same positions 64
times a layer, one row's dot products at a time. Likewise each prompt chunk whose cached
context starts with those blocks gathers and attends them on its own. Here the shared
positions are attended once for all of them: their queries are stacked per KV head into one
query block (rows x the GQA group's heads) and torch's flash attention for CPU (AMX /
AVX-512 GEMMs) computes it against the shared K/V, gathered once a layer; each row's or
chunk's own positions are attended apart (the paged kernel; a chunk's causal block), and
the two partial results merge by their log-sum-exps:

    out = out_own + (out_shared - out_own) * sigmoid(lse_shared - lse_own)

(softmax over all positions = the two partial softmaxes weighted by their sums,
w = e^lse_shared / (e^lse_shared + e^lse_own)). Same attention, another summation order:
outputs agree with the plain paths to float32 rounding (bfloat16: flash's part is rounded
to bfloat16 once before the merge; the AMX kernel's probabilities meet V in bfloat16).
FlashInfer's cascade attention and vLLM's `use_cascade_attention` do this on GPUs; vLLM's
CPU backend does not.

Where it pays, on the AMX Xeon in bfloat16 (one layer, 64 decode rows over 1,024 shared +
~40 own positions): 2.17 -> 0.96 ms against the paged kernel alone, in float32 2.98 -> 2.70.
A decode group must pay its fixed cost (`FLASH_RULE`, `TILED_RULE`); prompt chunks need
`MIN_CHUNKS` on `MIN_SHARED_TOKENS`. Elsewhere the plain paths run.

On AMX (bfloat16 cache and queries) the shared part is our kernel
(engine/cpu_kernels/shared_attention.cpp): the shared blocks read in place, no gather,
and a decode group's result merged into the rows' own attention inside the kernel, so groups
of a few rows pay too (a tenant's rows on its system prompt); a whole decode layer, 64 rows
over 1,024 shared positions: 0.89 ms against the paged kernel's 1.79, four groups of 8 rows:
0.76 against 1.24. Prompt chunks do not cascade there: the same kernel attends each chunk's
whole context causally from the cache, faster than the shared part and the own parts apart
(engine/attention/cpu_paged.py).

Without AMX, where the CPU has a fast AVX-512 BF16 `vdpbf16ps`, the same kernel runs its
tile products on that instruction (`tiled_kernel`): on an AMD EPYC (Zen 5, 2 threads), one
layer, bf16, 12 / 4 heads of 64 over 1,024 shared positions, 0.33 ms against the gather and
flash path's 1.55 at 64 rows, 0.065 / 0.35 at 8, 21 / 77 at 4,096 (torch's flash attention
reaches MKL's float32 AVX2 kernels there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from core import env
from engine import cpu_kernels
from engine.attention.backend import AttentionMetadata, PrefillChunk
from engine.attention.torch_paged import gather_blocks


@dataclass(frozen=True)
class DecodeRule:
    """When a group of decode rows on one prefix is cascaded: its rows, its shared positions,
    and rows x shared positions (the reads it saves must pay its fixed cost)."""

    min_rows: int
    min_shared_tokens: int
    min_shared_reads: int


FLASH_RULE = DecodeRule(min_rows=4, min_shared_tokens=128, min_shared_reads=12_288)
"""The gather and flash path: its fixed cost (the gather, a flash call, the merge: ~0.1-0.2
ms a layer) is more than the paged kernel's reads it saves (~34 us a row a layer at 1,024
positions) below 12,288 reads. One layer, bf16, 12 / 4 heads of 64: cascade against the
paged kernel alone at 1,024 shared positions 0.26 / 0.16 ms (4 rows), 0.30 / 0.28 (8), 0.42
/ 0.55 (16), 0.84 / 2.28 (64); at 256 positions break-even near 28 rows (0.29 / 0.33 at
32)."""
TILED_RULE = DecodeRule(min_rows=3, min_shared_tokens=512, min_shared_reads=4_096)
"""Our kernel (no copy, merged in place; measured on AMX, kept for its AVX-512 BF16 build,
whose fixed costs are the same): one decode layer, bf16, 12 / 4 heads of 64,
cache cold, groups of r rows with 64 positions each of their own, cascade / paged kernel
alone: at 2,048 shared positions 1.33 (r = 2), 0.92 (3), 0.72 (4), 0.46 (16); at 1,024: 1.30,
1.04, 0.95, 0.64 (16), 0.50 (64); at 512: 1.40 (2), 1.21 (4), 1.04 (6), 0.88 (8), 0.85 (16);
at 256: 1.72 (2), 1.24 (6), 1.09 (16), 0.89 (64)."""
TILED_MAX_QUERIES = 1024
"""More decode rows than this in one group: the gather and flash attention (see tiled_kernel).
The kernel is ahead of it at 2,048 and 4,096 rows over 1,024 shared positions (6.4 / 12.7 ms
against 9.5 / 17.6, one layer, bf16, 12 / 4 heads of 64), behind at 4,096 over 4,096 (83
against 71: each work item walks every position, and that many no longer stay in cache);
a step seldom has this many decode rows (`max_num_seqs`)."""
DPBF16_OVER_FMA = 0.65
"""`kernel_module`'s bar for the AVX-512 BF16 build (engine/layers/cpu_gemm.py's for its
bf16 linears: below it float32 FMAs outrun the instruction)."""
MIN_CHUNKS = 2
"""Fewer prompt chunks on one prefix than this: each chunk alone."""
MIN_SHARED_TOKENS = 128
"""A shared prefix of prompt chunks shorter than this: each chunk alone."""

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True)
class SharedPrefix:
    """Groups of the step's decode rows that start with the same blocks, and what every row
    keeps of its own."""

    groups: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    """(rows [n], shared block ids [P]) per group."""
    tail_tables: torch.Tensor
    """[B, M] each row's block table past its group's shared blocks (a row in no group: its
    whole table)."""
    tail_lens: torch.Tensor
    """[B] each row's positions past them (at least its new token)."""


@dataclass(frozen=True)
class SharedChunks:
    """Prompt chunks of one step whose cached context starts with the same blocks."""

    blocks: torch.Tensor
    chunks: tuple[PrefillChunk, ...]


def shared_prefix(meta: AttentionMetadata, tiled: bool = False) -> SharedPrefix | None:
    """The step's decode rows grouped by their first block, each group with the leading full
    blocks its rows have in common, found once a step (every layer has the same tables);
    only groups where cascade pays (by our kernel's rule where `tiled`, every layer's
    kernel being the same), None if there is none."""
    state = meta.backend_state
    if "cascade_decode" not in state:
        state["cascade_decode"] = _find_decode(meta, TILED_RULE if tiled else FLASH_RULE)
    return state["cascade_decode"]


def shared_chunks(meta: AttentionMetadata) -> list[SharedChunks]:
    """Groups of the step's prompt chunks by the blocks their cached contexts share, once a
    step; only groups where cascade pays."""
    state = meta.backend_state
    if "cascade_prefill" not in state:
        state["cascade_prefill"] = _find_chunks(meta)
    return state["cascade_prefill"]


def _find_decode(meta: AttentionMetadata, rule: DecodeRule) -> SharedPrefix | None:
    tables, lens, bs = meta.decode_block_tables, meta.decode_seq_lens, meta.block_size
    longest = int(lens.max())
    if meta.num_decodes < rule.min_rows or meta.num_decodes * longest < rule.min_shared_reads:
        return None  # no group could pay: skip the grouping (every step of a small batch)
    if longest <= rule.min_shared_tokens:
        return None
    _, members, counts = torch.unique(tables[:, 0], return_inverse=True, return_counts=True)
    groups = []
    skip = torch.zeros_like(lens)  # blocks each row leaves to its group
    for g in torch.nonzero(counts >= rule.min_rows).flatten().tolist():
        rows = torch.nonzero(members == g).flatten()
        # Only blocks that are full in every row, and each row keeps at least its new position.
        limit = (int(lens[rows].min()) - 1) // bs
        shared = _common_blocks(tables[rows, :limit]) if limit * bs >= rule.min_shared_tokens else 0
        tokens = shared * bs
        if tokens >= rule.min_shared_tokens and len(rows) * tokens >= rule.min_shared_reads:
            groups.append((rows, tables[rows[0], :shared].clone()))
            skip[rows] = shared
    if not groups:
        return None
    columns = torch.arange(tables.shape[1]) + skip[:, None]
    tails = tables.gather(1, columns.clamp_(max=tables.shape[1] - 1))  # past the end: masked
    return SharedPrefix(tuple(groups), tails, lens - skip * bs)


def _find_chunks(meta: AttentionMetadata) -> list[SharedChunks]:
    bs = meta.block_size
    by_first: dict[int, list[PrefillChunk]] = {}
    for chunk in meta.prefills:
        if chunk.seq_len - chunk.query_len >= MIN_SHARED_TOKENS:
            by_first.setdefault(int(chunk.block_ids[0]), []).append(chunk)
    found = []
    for chunks in by_first.values():
        if len(chunks) < MIN_CHUNKS:
            continue
        # Only blocks before every chunk's queries (no mask on the shared part).
        limit = min((c.seq_len - c.query_len) // bs for c in chunks)
        shared = _common_blocks(torch.stack([c.block_ids[:limit] for c in chunks]))
        if shared * bs >= MIN_SHARED_TOKENS:
            found.append(SharedChunks(chunks[0].block_ids[:shared].clone(), tuple(chunks)))
    return found


def _common_blocks(tables: torch.Tensor) -> int:
    """How many leading columns of `tables` ([rows, n]) are the same in every row."""
    same = (tables == tables[:1]).all(0)
    return int(same.numel()) if bool(same.all()) else int(same.to(torch.int8).argmin())


def shared_attention(
    q: torch.Tensor, kv_layer: torch.Tensor, blocks: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, Hq, D] over the shared blocks -> (out [N, Hq, D], lse [N, Hq]): by our kernel
    where it runs (out float32), else by a gather and flash attention (out in q's dtype)."""
    kernel = tiled_kernel(q, kv_layer)
    if kernel is not None:
        out = torch.empty(q.shape, dtype=torch.float32)
        lse = torch.empty(q.shape[:2], dtype=torch.float32)
        kernel(q.contiguous(), kv_layer, blocks, scale, out, lse)
        return out, lse
    rows, hq, d = q.shape
    hk = kv_layer.shape[3]
    group = hq // hk
    # [P, bs, Hk, D] -> [1, Hk, P * bs, D]: one copy of the shared K and V a layer.
    k = gather_blocks(kv_layer, blocks, 0, q.dtype).transpose(0, 1).unsqueeze(0)
    v = gather_blocks(kv_layer, blocks, 1, q.dtype).transpose(0, 1).unsqueeze(0)
    # Query heads h * group .. of every row attend KV head h: one query block per KV head.
    stacked = q.view(rows, hk, group, d).permute(1, 0, 2, 3).reshape(1, hk, rows * group, d)
    out, lse = _flash(stacked, k, v, 0.0, False, scale=scale)
    out = out.view(hk, rows, group, d).permute(1, 0, 2, 3).reshape(rows, hq, d)
    return out, lse.view(hk, rows, group).permute(1, 0, 2).reshape(rows, hq)


def tiled_kernel(
    q: torch.Tensor, kv_layer: torch.Tensor, rows: int | None = None
) -> Callable[..., None] | None:
    """engine/cpu_kernels/shared_attention.cpp (`kernel_module`) for these shapes, or None:
    bfloat16 queries and cache, block size a multiple of 16, head size of 32 up to 256, no
    more than `TILED_MAX_QUERIES` rows (q's, unless `rows` says how many). The CPU backend
    also runs prompt chunks on its module, causally (engine/attention/cpu_paged.py)."""
    bs, d = kv_layer.shape[2], q.shape[2]
    if not (q.dtype == kv_layer.dtype == torch.bfloat16 and kv_layer.is_contiguous()):
        return None
    if bs % 16 or d % 32 or d > 256 or (q.shape[0] if rows is None else rows) > TILED_MAX_QUERIES:
        return None
    module = kernel_module()
    return None if module is None else module.shared_attention_bf16


@functools.cache
def kernel_module() -> Any | None:
    """The build of shared_attention.cpp this CPU runs: on AMX where it has it, else on
    AVX-512 BF16 where `vdpbf16ps` is not slow (at least `DPBF16_OVER_FMA` of the float32
    FMAs' FLOPs; only a CPU where it was 1.85 has measured this build against the flash
    path), else None (the gather and flash path). BATON_SHARED_ATTENTION_DOT=0 keeps a CPU
    without AMX on the flash path."""
    amx = cpu_kernels.load_available("shared_attention_amx")
    if amx is not None or not env.SHARED_ATTENTION_DOT.get():
        return amx
    ratio = cpu_kernels.dpbf16_over_fma()
    if ratio is None or ratio < DPBF16_OVER_FMA:
        return None
    return cpu_kernels.load_available("shared_attention_dot")


def chunk_group_into(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    kv_layer: torch.Tensor, group: SharedChunks, block_size: int, scale: float,
) -> None:  # fmt: skip
    """Attention of a group's chunks (their rows of q) into the same rows of `out`."""
    chunks = group.chunks
    first, last = chunks[0].query_start, chunks[-1].query_start + chunks[-1].query_len
    if last - first == sum(c.query_len for c in chunks):  # one run of rows: views, no copies
        rows: slice | torch.Tensor = slice(first, last)
    else:
        rows = torch.cat([torch.arange(c.query_start, c.query_start + c.query_len) for c in chunks])
    shared_out, shared_lse = shared_attention(q[rows], kv_layer, group.blocks, scale)
    skip = int(group.blocks.numel()) * block_size
    own_out, own_lse = _own_parts(q, k, v, kv_layer, chunks, skip, block_size, scale)
    # In the model's dtype (a float32 merge of bfloat16 parts moved ~4x the bytes: 2.8 ms
    # against 0.3 for 2,048 rows x 12 heads): the weight is rounded like the parts.
    out[rows] = merge(shared_out, shared_lse, own_out, own_lse, out.dtype)


def _own_parts(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
    chunks: tuple[PrefillChunk, ...], skip: int, block_size: int, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The chunks' queries over their positions from `skip` on -> (out [rows, Hq, D], lse
    [rows, Hq]), rows in the chunks' order."""
    n = chunks[0].query_len
    fresh = all(c.seq_len - skip == c.query_len == n for c in chunks)
    if fresh and chunks[-1].query_start - chunks[0].query_start == (len(chunks) - 1) * n:
        # Equal chunks with nothing cached past the shared blocks, in one run of rows (the
        # continuations of one prefix): one causal call over their own K/V for them all.
        rows = slice(chunks[0].query_start, chunks[0].query_start + len(chunks) * n)
        o, lse = _causal(_heads_first(q[rows], n), _heads_first(k[rows], n),
                         _heads_first(v[rows], n), None, scale)  # fmt: skip
        return o.transpose(1, 2).flatten(0, 1), lse.transpose(1, 2).flatten(0, 1)
    parts = [_own_part(q, k, v, kv_layer, c, skip, block_size, scale) for c in chunks]
    return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])


def _heads_first(x: torch.Tensor, n: int) -> torch.Tensor:
    """[chunks * n, H, D] -> [chunks, H, n, D]."""
    return x.view(-1, n, *x.shape[1:]).transpose(1, 2)


def _causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash attention [B, Hq, L, D] over [B, Hk, S, D], causal (bottom-right by `mask` when
    given) -> (out [B, Hq, L, D], lse [B, Hq, L])."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return _flash(q, k, v, 0.0, mask is None, attn_mask=mask, scale=scale)


def _own_part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
    chunk: PrefillChunk, skip: int, block_size: int, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """A chunk's queries over its positions from `skip` on (cached ones and its own, causal)."""
    rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
    context = chunk.seq_len - skip
    if context == chunk.query_len:  # nothing cached past the shared blocks: the chunk's K/V
        keys, values, mask = k[rows], v[rows], None
    else:
        own_blocks = chunk.block_ids[skip // block_size :]
        keys = gather_blocks(kv_layer, own_blocks, 0, q.dtype)[:context]
        values = gather_blocks(kv_layer, own_blocks, 1, q.dtype)[:context]
        first = context - chunk.query_len  # bottom-right aligned causal, additive
        hidden = torch.arange(context)[None, :] > torch.arange(first, context)[:, None]
        mask = torch.zeros(hidden.shape, dtype=q.dtype).masked_fill_(hidden, float("-inf"))
    out, lse = _causal(_heads_first(q[rows], chunk.query_len), _heads_first(keys, context),
                       _heads_first(values, context), mask, scale)  # fmt: skip
    return out[0].transpose(0, 1), lse[0].transpose(0, 1)


def decode_shared(
    q: torch.Tensor, kv_layer: torch.Tensor, prefix: SharedPrefix, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every group's rows over their shared blocks -> (out [B, Hq, D], lse [B, Hq]); a row in
    no group has lse -inf, so merging leaves its own attention as it is."""
    if len(prefix.groups) == 1 and len(prefix.groups[0][0]) == q.shape[0]:
        return shared_attention(q, kv_layer, prefix.groups[0][1], scale)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:2], float("-inf"))
    for rows, blocks in prefix.groups:
        # float32 from the AMX kernel, q's dtype from the flash path (a CPU without AMX)
        group_out, lse[rows] = shared_attention(q[rows], kv_layer, blocks, scale)
        out[rows] = group_out.to(out.dtype)
    return out, lse


def merge_groups_into(
    out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, kv_layer: torch.Tensor,
    prefix: SharedPrefix, scale: float,
) -> torch.Tensor:  # fmt: skip
    """out [B, Hq, D] / lse [B, Hq] (float32), every row's attention over its own positions
    (past its group's shared blocks) -> the attention over all of them. On AMX each group's
    shared part is merged in place by the kernel (no copies: the Python-side merge, a dozen
    small ops a layer, cost more than a small group's attention), else computed apart and
    merged here."""
    kernel = tiled_kernel(q, kv_layer)
    if kernel is not None:
        q = q.contiguous()
        for rows, blocks in prefix.groups:
            kernel(q, kv_layer, blocks, scale, out, lse, rows, True)
        return out
    shared, shared_lse = decode_shared(q, kv_layer, prefix, scale)
    return merge(shared, shared_lse, out, lse, torch.float32)


def merge(
    out_shared: torch.Tensor, lse_shared: torch.Tensor, out_own: torch.Tensor,
    lse_own: torch.Tensor, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """Two attentions of the same queries over disjoint positions -> the attention over all
    of them, computed in `dtype` (out_own's shape)."""
    weight = torch.sigmoid(lse_shared - lse_own).unsqueeze(-1).to(dtype)
    return torch.lerp(out_own.to(dtype), out_shared.to(dtype), weight)
