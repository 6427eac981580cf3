"""Paged prefill / extend attention: ragged chunks of new tokens, causal, over the cache.

A chunk is `query_len` new tokens of one sequence whose context after the chunk is `seq_len`
tokens; its K/V (prefix and new tokens alike) are already in the paged cache, written by
reshape-and-cache earlier in the step. That one rule serves a fresh prompt (prefix 0),
chunked prefill, prefix-cache hits and KV received from another worker.

    keys of chunk c:   0 ........ prefix-1 | prefix ........ seq_len-1
                       cached prefix        this chunk's queries (prefix = seq_len - query_len)
    query row r attends keys [0, prefix + r]   (causal, bottom-right aligned)

The grid is (tile, query head): a tile is BLOCK_M query rows of one chunk. The host lists
the tiles once per step (it knows the chunk lengths), so no program idles on padding; a
step replayed from a CUDA graph (engine/step_graphs.py) launches a fixed number of tiles,
and those past the step's list name a chunk of no queries and return at once.

Keys are read one of two ways (`LaunchConfig.whole_pages`):

    gather       BLOCK_N keys a step, each key's address through the block table (any page
                 size, head_dim or cache dtype)
    whole pages  1, 2 or 4 pages a step, each page's K and V in one tensor-descriptor load
                 (TMA on Hopper; engine/kernels/_whole_pages.py); from the page holding the
                 tile's first query on (the causal mask's), one a step

Tile sizes, warps, stages and the way of reading (`launch_config`) are chosen by timing the
candidates on the device (`bench.engine.kernels --tune`, the device check): a device with a
tuned table (engine/kernels/tuned.py) uses its entry, any other the H100's choice
(docs/performance.md, "The Triton kernels on an H100").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.device import host_to_device
from engine.kernels import tuned
from engine.kernels._checks import (
    INDEX_DTYPES,
    QUANTIZED_CACHE,
    check,
    check_tensor,
    dot_dtype,
    dot_precision,
    next_pow2,
)
from engine.kernels._paged_attention import (
    attend_paged_kv,
    cached_values,
    check_paged_attention,
    initial_state,
)
from engine.kernels._whole_pages import (
    MULTI_PAGE_STEPS,
    attend_page_groups,
    attend_pages,
    page_descriptor,
    whole_pages_fit,
)

BLOCK_M = 64


@dataclass(frozen=True)
class LaunchConfig:
    """How one prefill launch is cut: keys per loop step, warps per program, pipeline
    stages, whether keys come as whole pages through tensor descriptors (then a step reads
    `pages_per_step` pages: `block_n` keys where the cache's pages allow), and the query
    rows a tile (`block_m`: what a step's layout is built with; a launch cuts tiles as its
    layout does)."""

    block_n: int
    num_warps: int
    num_stages: int
    whole_pages: bool = False
    block_m: int = BLOCK_M

    def pages_per_step(self, page: int) -> int:
        """Whole pages a step for a cache of `page`-token pages: the most of 1, 2 or 4 that
        holds no more than `block_n` keys (one page at least)."""
        return next((n for n in MULTI_PAGE_STEPS if n * page <= self.block_n), 1)


def launch_config(dtype: torch.dtype, head_dim: int, device: torch.device | None = None
                  ) -> LaunchConfig:  # fmt: skip
    """The device's tuned entry where it has one (engine/kernels/tuned.py), else the fastest
    measured at head_dim 128 with BLOCK_M rows a tile (`bench.engine.kernels --tune` on an
    H100): bfloat16 32 keys, 4 warps, 2 stages (2.0x the 32-row tiles and Triton's default
    stages before it); float32's tiles spill registers at 4 warps (11x slower), so 8 warps
    and one stage. A head_dim above 128 (not measured) halves the keys."""
    entry = tuned.prefill_entry(device, dtype, head_dim)
    if entry is not None:
        return LaunchConfig(**entry)  # a table without `block_m` keeps BLOCK_M
    if dtype == torch.float32:
        return LaunchConfig(block_n=32 if head_dim <= 128 else 16, num_warps=8, num_stages=1)
    if head_dim > 128:
        return LaunchConfig(block_n=16, num_warps=8, num_stages=2)
    return LaunchConfig(block_n=32, num_warps=4, num_stages=2)


def launch_for(
    kv_layer: torch.Tensor, dtype: torch.dtype, head_dim: int, device: torch.device | None
) -> LaunchConfig:
    """The launch a step runs on this cache layer (and the tile height its layout takes):
    the device's (`launch_config`), or where that reads whole pages the layer cannot give
    (a quantized cache, pages of another size), the default gather."""
    config = launch_config(dtype, head_dim, device)
    if config.whole_pages and not whole_pages_fit(kv_layer, head_dim):
        return launch_config(dtype, head_dim)
    return config


@dataclass(frozen=True)
class PrefillLayout:
    """The step's chunks as device tensors, plus the tile list the kernel's grid walks
    (`block_m` query rows a tile)."""

    query_starts: torch.Tensor  # [C] row of each chunk's first query in q
    query_lens: torch.Tensor  # [C]
    seq_lens: torch.Tensor  # [C]
    block_tables: torch.Tensor  # [C, max_blocks], padded with 0 (never read)
    tile_chunks: torch.Tensor  # [num_tiles] chunk of each tile
    tile_rows: torch.Tensor  # [num_tiles] first query row (within its chunk) of each tile
    block_m: int = BLOCK_M

    @staticmethod
    def build(
        query_starts: list[int],
        query_lens: list[int],
        seq_lens: list[int],
        block_ids: list[list[int]] | list[torch.Tensor],
        device: torch.device,
        block_m: int = BLOCK_M,
    ) -> PrefillLayout:
        n = len(query_lens)
        check(
            len(query_starts) == n == len(seq_lens) == len(block_ids),
            "query_starts, query_lens, seq_lens and block_ids need one entry per chunk",
        )
        for i, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
            check(1 <= ql <= sl, f"chunk {i}: need 1 <= query_len ({ql}) <= seq_len ({sl})")
        tiles = [(c, r) for c, ql in enumerate(query_lens) for r in range(0, ql, block_m)]

        def as_tensor(values: list[int]) -> torch.Tensor:
            return host_to_device(values, torch.int32, device)

        if n and isinstance(block_ids[0], torch.Tensor):
            # Device tensors stay on the device: pad there instead of syncing to the host.
            tensors: list[torch.Tensor] = block_ids  # type: ignore[assignment]
            padded = torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True)
            table = padded.to(device=device, dtype=torch.int32)
        else:
            width = max((len(b) for b in block_ids), default=0)
            rows = [list(b) + [0] * (width - len(b)) for b in block_ids]  # type: ignore[arg-type]
            table = host_to_device(rows, torch.int32, device).reshape(n, width)

        return PrefillLayout(
            as_tensor(query_starts),
            as_tensor(query_lens),
            as_tensor(seq_lens),
            table,
            as_tensor([c for c, _ in tiles]),
            as_tensor([r for _, r in tiles]),
            block_m,
        )


@triton.jit
def _prefill_kernel(
    q_ptr, kv_ptr, out_ptr,
    starts_ptr, qlens_ptr, seqlens_ptr, table_ptr, tile_chunks_ptr, tile_rows_ptr,
    scale,
    stride_qt, stride_qh,
    stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
    stride_tb,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, QUANT: tl.constexpr, WHOLE_PAGES: tl.constexpr,
    PAGES: tl.constexpr,
):  # fmt: skip
    """`kv_ptr` is the cache layer's pointer, or with WHOLE_PAGES a tensor descriptor over it
    viewed [num_blocks * 2 * PAGE, Hk * HEAD_DIM] in [PAGE, HEAD_DIM] blocks, read PAGES
    pages a step up to the page holding the tile's first query."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    chunk = tl.load(tile_chunks_ptr + tile)
    row0 = tl.load(tile_rows_ptr + tile)
    q_start = tl.load(starts_ptr + chunk)
    q_len = tl.load(qlens_ptr + chunk)
    if row0 >= q_len:
        return  # a padding tile of a captured step's fixed grid
    seq_len = tl.load(seqlens_ptr + chunk)
    prefix = seq_len - q_len
    kv_head = head // GROUP

    rows = row0 + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_offs = (q_start + rows).to(tl.int64)[:, None] * stride_qt + head * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = prefix + rows

    # Keys before the tile's first query position are visible to every row (no causal mask);
    # keys past its last are masked for every row: stop there.
    diagonal = prefix + row0
    end = tl.minimum(seq_len, diagonal + BLOCK_M)
    m, denom, acc = initial_state(BLOCK_M, BLOCK_D)
    # One branch or the other, each to its store: the compiler builds only the branch a
    # constexpr picks, where code after an early `return` would still be built (and the
    # gather path cannot take a tensor descriptor).
    if WHOLE_PAGES:
        # Pages wholly before the diagonal need no mask; the page holding it is visible to
        # every row in part, so each row's maximum is finite after the first page either way.
        table = table_ptr + chunk * stride_tb
        below = diagonal // PAGE
        scale2 = scale * 1.4426950408889634  # exp(x) = exp2(x log2 e)
        grouped = 0
        if PAGES > 1:
            grouped = below // PAGES * PAGES
            m, denom, acc = attend_page_groups(
                m, denom, acc, q, kv_ptr, table, kv_head, grouped, scale2,
                HEAD_DIM, PAGE, PAGES, PRECISION, DOT,
            )  # fmt: skip
        m, denom, acc = attend_pages(
            m, denom, acc, q, q_pos, kv_ptr, table, kv_head, grouped, below, end, scale2,
            HEAD_DIM, PAGE, False, PRECISION, DOT,
        )  # fmt: skip
        _, denom, acc = attend_pages(
            m, denom, acc, q, q_pos, kv_ptr, table, kv_head, below, tl.cdiv(end, PAGE), end,
            scale2, HEAD_DIM, PAGE, True, PRECISION, DOT,
        )  # fmt: skip
        _store(out_ptr, acc / denom[:, None], q_start, rows, row_mask, head, stride_ot,
               stride_oh, HEAD_DIM, BLOCK_D)  # fmt: skip
    else:
        m, denom, acc = attend_paged_kv(
            m, denom, acc, q, q_pos, kv_ptr, table_ptr, chunk, kv_head, 0, diagonal, scale,
            stride_tb, stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
            BLOCK_M, HEAD_DIM, PAGE, BLOCK_N, BLOCK_D, False, PRECISION, DOT, QUANT,
        )  # fmt: skip
        # Key `diagonal` is visible to every row, so each row's maximum is finite from here.
        _, denom, acc = attend_paged_kv(
            m, denom, acc, q, q_pos, kv_ptr, table_ptr, chunk, kv_head, diagonal, end, scale,
            stride_tb, stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
            BLOCK_M, HEAD_DIM, PAGE, BLOCK_N, BLOCK_D, True, PRECISION, DOT, QUANT,
        )  # fmt: skip
        _store(out_ptr, acc / denom[:, None], q_start, rows, row_mask, head, stride_ot,
               stride_oh, HEAD_DIM, BLOCK_D)  # fmt: skip


@triton.jit
def _store(out_ptr, out, q_start, rows, row_mask, head, stride_ot, stride_oh,
           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    o_offs = (q_start + rows).to(tl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :]
    mask = row_mask[:, None] & (d < HEAD_DIM)[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def paged_prefill_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    layout: PrefillLayout,
    scale: float,
    out: torch.Tensor | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D] (rows outside the layout's chunks are neither read nor written);
    kv_layer: [num_blocks, 2, block_size, Hk, D] already holding the chunks' K/V.
    Returns [T, Hq, D] (into `out`). `config`: `launch_for`'s unless given (benchmarks)."""
    out, page, num_kv_heads = check_paged_attention(q, kv_layer, out)
    for name in ("query_starts", "query_lens", "seq_lens", "tile_chunks", "tile_rows"):
        check_tensor(name, getattr(layout, name), 1, INDEX_DTYPES, q.device)
    check_tensor("block_tables", layout.block_tables, 2, INDEX_DTYPES, q.device)
    _, num_heads, head_dim = q.shape
    num_tiles = layout.tile_chunks.shape[0]
    if num_tiles == 0:
        return out
    config = config or launch_for(kv_layer, q.dtype, head_dim, q.device)
    kv = kv_layer
    if config.whole_pages:
        check(whole_pages_fit(kv_layer, head_dim),
              "a whole-pages launch needs a contiguous, unquantized cache layer, power-of-two "
              f"pages of 16 to 64 tokens and a power-of-two head_dim (got {kv_layer.dtype}, "
              f"pages of {page}, head_dim {head_dim})")  # fmt: skip
        kv = page_descriptor(kv_layer, page, head_dim)
    _prefill_kernel[(num_tiles, num_heads)](
        q, kv, out,
        layout.query_starts, layout.query_lens, layout.seq_lens, layout.block_tables,
        layout.tile_chunks, layout.tile_rows,
        scale,
        q.stride(0), q.stride(1),
        kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
        layout.block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE=page, BLOCK_M=layout.block_m,
        BLOCK_N=config.block_n, BLOCK_D=next_pow2(head_dim),
        PRECISION=dot_precision(q.dtype), DOT=dot_dtype(q.dtype),
        QUANT=kv_layer.dtype in QUANTIZED_CACHE, WHOLE_PAGES=config.whole_pages,
        PAGES=config.pages_per_step(page) if config.whole_pages else 1,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out


def paged_prefill_attention_ref(
    q: torch.Tensor, kv_layer: torch.Tensor, layout: PrefillLayout, scale: float
) -> torch.Tensor:
    """The same contract in plain torch, one chunk at a time, in float32. Rows outside the
    chunks are returned as NaN (they are not the kernel's to write)."""
    out = torch.full_like(q, float("nan"))
    page = kv_layer.shape[2]
    for c in range(layout.query_lens.shape[0]):
        start, q_len, n = (int(layout.query_starts[c]), int(layout.query_lens[c]),
                           int(layout.seq_lens[c]))  # fmt: skip
        blocks = layout.block_tables[c, : -(-n // page)].long()
        k = cached_values(kv_layer[blocks, 0].flatten(0, 1)[:n])
        v = cached_values(kv_layer[blocks, 1].flatten(0, 1)[:n])
        q_pos = torch.arange(q_len, device=q.device) + (n - q_len)
        mask = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]
        o = F.scaled_dot_product_attention(
            q[start : start + q_len].float().transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[start : start + q_len] = o.transpose(0, 1).to(q.dtype)
    return out
