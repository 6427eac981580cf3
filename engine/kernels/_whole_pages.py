"""Prefill attention's keys read in whole pages through tensor descriptors (TMA on Hopper:
a bulk copy into shared memory, no per-token addresses), in the exp2 domain.

    the cache layer as rows     [num_blocks * 2 * PAGE, Hk * HEAD_DIM], read [PAGE, HEAD_DIM]
                                a load: block b's K page starts at row 2 b PAGE, its V page
                                PAGE rows further
    a step                      1, 2 or 4 pages: each page's scores, one check of the rows'
                                maxima for them all, then each page's V

The running sums are rescaled only when a row's maximum grows by more than 2^RESCALE_LOG2
(exact: the numerator and the denominator carry the same stale maximum), so short key steps
do not pay a rescale each; the check is a reduction across the tile's rows, which several
pages a step share, with independent loads and dots between them for the scheduler to
overlap.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from engine.kernels._checks import QUANTIZED_CACHE, next_pow2

RESCALE_LOG2 = tl.constexpr(8.0)
"""How far (in log2) a row's maximum may grow before its sums are rescaled."""
MULTI_PAGE_STEPS = (4, 2)
"""The page counts a step may read beside one (each its own branch in the kernel: Triton
holds no list of tiles)."""


def whole_pages_fit(kv_layer: torch.Tensor, head_dim: int) -> bool:
    """Whether a cache layer can be read in whole pages: contiguous, unquantized, pages of a
    power-of-two size and a power-of-two head_dim (a descriptor's block is a power of two)
    of at least 16 bytes; pages of 16 to 64 tokens (a dot takes 16 keys at least on a GPU,
    and a step of one larger page holds more than the tuned launches ever did)."""
    page = kv_layer.shape[2]
    return (
        kv_layer.is_contiguous()
        and kv_layer.dtype not in QUANTIZED_CACHE
        and page == next_pow2(page)
        and 16 <= page <= 64
        and head_dim == next_pow2(head_dim)
        and head_dim * kv_layer.element_size() >= 16
    )


@triton.jit
def attend_pages(
    m, denom, acc, q, q_pos, desc, table, kv_head, first, last, end, scale2,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """Pages [first, last) of the chunk whose block table starts at `table`, one a step, in
    the exp2 domain (`scale2` folds in log2 e): (m, denom, acc) as `attend_paged_kv` keeps
    them, except that m may trail a row's maximum by up to RESCALE_LOG2."""
    col = kv_head * HEAD_DIM
    for page in range(first, last):
        s, row = _page_scores(q, desc, table, page, col, scale2, PAGE, PRECISION, DOT)
        if CAUSAL:
            pos = page * PAGE + tl.arange(0, PAGE)
            s = tl.where((pos[None, :] <= q_pos[:, None]) & (pos < end)[None, :], s, float("-inf"))
        m, denom, acc = _raise_maximum(m, denom, acc, tl.max(s, 1))
        p = tl.exp2(s - m[:, None])
        denom += tl.sum(p, 1)
        v = desc.load([row + PAGE, col])
        if CAUSAL:
            v = tl.where((pos < end)[:, None], v, 0.0)  # slots past the context: any bits
        acc += tl.dot(p.to(DOT), v.to(DOT), input_precision=PRECISION)
    return m, denom, acc


@triton.jit
def attend_page_groups(
    m, denom, acc, q, desc, table, kv_head, last, scale2,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, PAGES: tl.constexpr, PRECISION: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """Pages [0, last) (a multiple of PAGES, every key visible to every row) PAGES at a
    time, as `attend_pages` reads them one at a time; PAGES is 2 or 4."""
    col = kv_head * HEAD_DIM
    for page in range(0, last, PAGES):
        s0, r0 = _page_scores(q, desc, table, page, col, scale2, PAGE, PRECISION, DOT)
        s1, r1 = _page_scores(q, desc, table, page + 1, col, scale2, PAGE, PRECISION, DOT)
        m_step = tl.maximum(tl.max(s0, 1), tl.max(s1, 1))
        if PAGES == 4:  # a constexpr: its names stay defined after it
            s2, r2 = _page_scores(q, desc, table, page + 2, col, scale2, PAGE, PRECISION, DOT)
            s3, r3 = _page_scores(q, desc, table, page + 3, col, scale2, PAGE, PRECISION, DOT)
            m_step = tl.maximum(m_step, tl.maximum(tl.max(s2, 1), tl.max(s3, 1)))
        m, denom, acc = _raise_maximum(m, denom, acc, m_step)
        p0 = tl.exp2(s0 - m[:, None])
        p1 = tl.exp2(s1 - m[:, None])
        denom += tl.sum(p0, 1) + tl.sum(p1, 1)
        acc = _page_values(acc, p0, desc, r0, col, PAGE, PRECISION, DOT)
        acc = _page_values(acc, p1, desc, r1, col, PAGE, PRECISION, DOT)
        if PAGES == 4:
            p2 = tl.exp2(s2 - m[:, None])
            p3 = tl.exp2(s3 - m[:, None])
            denom += tl.sum(p2, 1) + tl.sum(p3, 1)
            acc = _page_values(acc, p2, desc, r2, col, PAGE, PRECISION, DOT)
            acc = _page_values(acc, p3, desc, r3, col, PAGE, PRECISION, DOT)
    return m, denom, acc


@triton.jit
def _raise_maximum(m, denom, acc, m_step):
    """The sums carried to a new maximum where some row's grew past RESCALE_LOG2 (one check
    for the whole tile: a reduction across its rows)."""
    if tl.max(m_step - m, 0) > RESCALE_LOG2:
        m_new = tl.maximum(m, m_step)
        alpha = tl.exp2(m - m_new)
        denom = denom * alpha
        acc = acc * alpha[:, None]
        m = m_new
    return m, denom, acc


@triton.jit
def _page_scores(q, desc, table, page, col, scale2, PAGE: tl.constexpr,
                 PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    """A page's scores, and the descriptor row its K page starts at (an int32: a
    descriptor's coordinates are 32-bit)."""
    row = (tl.load(table + page) * (2 * PAGE)).to(tl.int32)
    k = desc.load([row, col])
    return tl.dot(q.to(DOT), tl.trans(k).to(DOT), input_precision=PRECISION) * scale2, row


@triton.jit
def _page_values(acc, p, desc, row, col, PAGE: tl.constexpr, PRECISION: tl.constexpr,
                 DOT: tl.constexpr):  # fmt: skip
    """acc plus a page's probabilities times its V page (which follows its K page)."""
    v = desc.load([row + PAGE, col])
    return tl.dot(p.to(DOT), v.to(DOT), acc, input_precision=PRECISION)


def page_descriptor(kv_layer: torch.Tensor, page: int, head_dim: int) -> TensorDescriptor:
    """The layer as rows of one token's K (or V) for every KV head, read [page, head_dim] at
    a time: block b's K page starts at row 2 b page, its V page at (2 b + 1) page."""
    rows = kv_layer.view(-1, kv_layer.shape[3] * head_dim)
    return TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [page, head_dim])
