"""Cascade attention (engine/attention/cascade.py): decode rows that share cached blocks
attend them once, together, and their own blocks through the paged kernel; the merged result
is the paged kernel's over the whole context, and the engine's greedy output the oracle's."""

from __future__ import annotations

import random

import pytest
import torch

from core.sampling import SamplingParams
from engine import LLM
from engine.attention import cascade
from engine.attention.backend import AttentionMetadata, PrefillChunk
from engine.attention.cpu_paged import load_kernel
from engine.attention.registry import get_backend
from tests import oracle
from tests.engine.test_cpu_attention import meta_for

pytestmark = pytest.mark.skipif(load_kernel() is None, reason="no C++ toolchain for the kernel")


EVERY_GROUP = cascade.DecodeRule(min_rows=4, min_shared_tokens=128, min_shared_reads=0)


@pytest.fixture(autouse=True)
def small_groups_pay(monkeypatch) -> None:
    """The shapes here are small: every group of 4 rows that shares 128 positions is cascaded,
    on either path (the cost rules have their own test)."""
    monkeypatch.setattr(cascade, "FLASH_RULE", EVERY_GROUP)
    monkeypatch.setattr(cascade, "TILED_RULE", EVERY_GROUP)


def shared_tables(
    rows: int, shared: int, own: int, gen: torch.Generator
) -> tuple[torch.Tensor, int]:
    """Block tables whose first `shared` blocks are the same scattered blocks in every row,
    then `own` blocks of each row's own; and the number of blocks they use."""
    total = shared + rows * own
    ids = torch.randperm(total + 7, generator=gen)[:total]
    tables = torch.empty(rows, shared + own, dtype=torch.long)
    tables[:, :shared] = ids[:shared]
    tables[:, shared:] = ids[shared:].view(rows, own)
    return tables, total + 7


def test_finds_the_leading_blocks_every_row_shares() -> None:
    gen = torch.Generator().manual_seed(0)
    tables, _ = shared_tables(6, 10, 3, gen)
    lens = torch.tensor([10 * 16 + n for n in (1, 5, 16, 30, 48, 2)])
    found = cascade.shared_prefix(meta_for(tables, lens, 16))
    assert found is not None and len(found.groups) == 1
    rows, blocks = found.groups[0]
    assert rows.tolist() == list(range(6)) and torch.equal(blocks, tables[0, :10])
    assert torch.equal(found.tail_tables[:, :3], tables[:, 10:])
    assert torch.equal(found.tail_lens, lens - 160)

    # One row diverging at block 9: the first 9 are shared.
    diverging = tables.clone()
    diverging[3, 9] = 10_000
    found = cascade.shared_prefix(meta_for(diverging, lens, 16))
    assert found is not None and found.groups[0][1].numel() == 9

    # Every row keeps at least its new position: a row ending at block 10's first position
    # leaves block 9 (full) shared, not block 10.
    short = lens.clone()
    short[2] = 10 * 16 + 1
    assert cascade.shared_prefix(meta_for(tables, short, 16)).groups[0][1].numel() == 10
    short[2] = 10 * 16
    assert cascade.shared_prefix(meta_for(tables, short, 16)).groups[0][1].numel() == 9


@pytest.mark.parametrize(
    ("rows", "shared_blocks", "why"),
    [(EVERY_GROUP.min_rows - 1, 20, "too few rows"), (8, 128 // 16 - 1, "short")],
)
def test_not_where_it_would_not_pay(rows: int, shared_blocks: int, why: str) -> None:
    tables, _ = shared_tables(rows, shared_blocks, 2, torch.Generator().manual_seed(1))
    lens = torch.full((rows,), shared_blocks * 16 + 9)
    assert cascade.shared_prefix(meta_for(tables, lens, 16)) is None, why
    # Rows with nothing in common, however many.
    tables = torch.randperm(400)[:320].view(16, 20)
    assert cascade.shared_prefix(meta_for(tables, torch.full((16,), 300), 16)) is None


def test_a_group_too_small_for_its_fixed_cost_is_not_cascaded(monkeypatch) -> None:
    monkeypatch.setattr(cascade, "FLASH_RULE", cascade.DecodeRule(4, 128, 12 * 1024))
    monkeypatch.setattr(cascade, "TILED_RULE", cascade.DecodeRule(3, 512, 4096))
    gen = torch.Generator().manual_seed(4)
    cases = [  # rows, shared blocks, cascaded by the flash path's rule, by the AMX kernel's
        (11, 64, False, True), (12, 64, True, True), (47, 16, False, False), (2, 128, False, False),
        (3, 128, False, True), (4, 64, False, True), (3, 64, False, False), (16, 31, False, False),
    ]  # fmt: skip
    for rows, shared_blocks, flash, amx in cases:
        tables, _ = shared_tables(rows, shared_blocks, 2, gen)
        lens = torch.full((rows,), shared_blocks * 16 + 9)
        for rule, cascaded in ((False, flash), (True, amx)):
            found = cascade.shared_prefix(meta_for(tables, lens, 16), tiled=rule)
            assert (found is not None) == cascaded, (rows, shared_blocks, rule)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_reports_each_heads_log_sum_exp(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    kv = torch.randn(40, 2, 16, 2, 64, generator=gen).to(dtype)
    tables = torch.stack([torch.randperm(40, generator=gen)[:5] for _ in range(3)])
    lens = torch.tensor([1, 33, 80])
    q = torch.randn(3, 6, 64, generator=gen)
    out, lse = torch.empty(3, 6, 64), torch.empty(3, 6)
    kernel = get_backend("cpu")._kernel_for(dtype)
    kernel(q, kv, tables, lens, 0.125, out, lse)
    for b, n in enumerate(lens.tolist()):
        keys = kv[tables[b], 0].flatten(0, 1)[:n].float()  # [n, 2, 64]
        scores = torch.einsum("hgd,nhd->hgn", q[b].view(2, 3, 64), keys) * 0.125
        torch.testing.assert_close(lse[b], torch.logsumexp(scores, -1).flatten())


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(12, 4), (8, 2), (6, 1), (4, 4)])
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("block_size", [16, 32])
def test_cascade_equals_the_paged_kernel(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    gen = torch.Generator().manual_seed(num_heads * 100 + head_dim + block_size)
    rows, shared = 9, -(-300 // block_size)
    tables, num_blocks = shared_tables(rows, shared, 4, gen)
    kv = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen)
    own = [1, 2, block_size, block_size + 1, 4 * block_size, 3, 50, 2 * block_size, 17]
    lens = torch.tensor([shared * block_size + n for n in own])
    q = torch.randn(rows, num_heads, head_dim, generator=gen)
    cpu, scale = get_backend("cpu"), head_dim**-0.5
    meta = meta_for(tables, lens, block_size)
    assert cascade.shared_prefix(meta) is not None
    got = cpu._decode(q, kv, meta, scale)
    alone = meta_for(tables, lens, block_size)
    alone.backend_state["cascade_decode"] = None  # the paged kernel over everything
    torch.testing.assert_close(got, cpu._decode(q, kv, alone, scale), rtol=1e-5, atol=1e-5)

    # bfloat16: the shared part's output is rounded once more before the merge.
    q16, kv16 = q.bfloat16(), kv.bfloat16()
    got16 = cpu._decode(q16, kv16, meta_for(tables, lens, block_size), scale)
    assert got16.dtype == torch.bfloat16
    want16 = cpu._decode(q16, kv16, alone, scale)
    torch.testing.assert_close(got16.float(), want16.float(), rtol=1.6e-2, atol=4e-3)


MIXED = "mixed"
"""Four chunks on one 10-block prefix (two with cached positions of their own past it, one
chunk of another prefix between them), two on another prefix (too short to share), one with
no context, one alone on a third prefix."""
CONTINUATIONS = "continuations"
"""Five chunks of 16 new tokens each on one prefix, one after another, then one of 40
without context."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_of_several_prefixes_attend_each_once(dtype: torch.dtype) -> None:
    """Tenants' system prompts: two groups of rows on two prefixes, a pair of rows on a third
    (too few to group) and rows of their own, interleaved; each group's prefix attended once
    for its rows, the rest through the paged kernel alone."""
    gen = torch.Generator().manual_seed(9)
    kv = torch.randn(300, 2, 16, 2, 64, generator=gen).to(dtype)
    ids = iter(torch.randperm(300, generator=gen).tolist())
    prefixes = {name: [next(ids) for _ in range(n)] for name, n in (("a", 9), ("b", 12), ("c", 10))}
    layout = ["a", "b", None, "a", "c", "b", "a", "b", None, "c", "a", "b"]
    tables, lens = [], []
    for i, name in enumerate(layout):
        own = [next(ids) for _ in range(20 - len(prefixes.get(name, [])))]
        tables.append(prefixes.get(name, []) + own)
        lens.append(len(prefixes.get(name, [])) * 16 + 1 + 5 * i)
    tables, lens = torch.tensor(tables), torch.tensor(lens)
    found = cascade.shared_prefix(meta_for(tables, lens, 16))
    assert found is not None
    assert sorted(rows.tolist() for rows, _ in found.groups) == [[0, 3, 6, 10], [1, 5, 7, 11]]
    q = torch.randn(len(layout), 6, 64, generator=gen).to(dtype)
    cpu = get_backend("cpu")
    got = cpu._decode(q, kv, meta_for(tables, lens, 16), 0.125)
    alone = meta_for(tables, lens, 16)
    alone.backend_state["cascade_decode"] = None
    want = cpu._decode(q, kv, alone, 0.125)
    for row in (2, 4, 8, 9):  # in no group: exactly the paged kernel's
        assert torch.equal(got[row], want[row])
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 4e-3}
    torch.testing.assert_close(got.float(), want.float(), **tol)


def prefill_case(
    case: str, dtype: torch.dtype, gen: torch.Generator
) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's prompt chunks (MIXED or CONTINUATIONS); the cache holds every chunk's new
    K/V at its slots."""
    bs, hq, hk, d = 16, 12, 4, 64
    kv = torch.randn(400, 2, bs, hk, d, generator=gen).to(dtype)
    ids = iter(torch.randperm(400, generator=gen).tolist())
    prefix_a = [next(ids) for _ in range(10)]
    prefix_b = [next(ids) for _ in range(4)]
    prefix_c = [next(ids) for _ in range(9)]
    # (prefix, cached positions past it, new tokens)
    if case == MIXED:
        shapes = [(prefix_a, 0, 64), (prefix_a, 0, 5), (prefix_c, 0, 12), (prefix_a, 20, 33)]
        shapes += [(prefix_a, 3, 1), (prefix_b, 100, 7), (prefix_b, 100, 9), ([], 0, 40)]
    else:
        shapes = [(prefix_a, 0, 16)] * 5 + [([], 0, 40)]
    chunks, new_k, new_v, start = [], [], [], 0
    for prefix, cached, new in shapes:
        seq_len = len(prefix) * bs + cached + new
        blocks = prefix + [next(ids) for _ in range(-(-seq_len // bs) - len(prefix))]
        block_ids = torch.tensor(blocks)
        chunks.append(PrefillChunk(start, new, seq_len, block_ids))
        positions = torch.arange(seq_len - new, seq_len)
        new_k.append(kv[block_ids[positions // bs], 0, positions % bs])
        new_v.append(kv[block_ids[positions // bs], 1, positions % bs])
        start += new
    empty = torch.zeros(0, dtype=torch.long)
    meta = AttentionMetadata(
        block_size=bs, slot_blocks=empty, slot_offsets=empty, num_decodes=0,
        decode_block_tables=torch.zeros(0, 1, dtype=torch.long), decode_seq_lens=empty,
        prefills=chunks,
    )  # fmt: skip
    q = torch.randn(start, hq, d, generator=gen).to(dtype)
    return meta, q, torch.cat(new_k), torch.cat(new_v), kv


@pytest.mark.parametrize("case", [MIXED, CONTINUATIONS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_chunks_on_one_prefix_attend_it_once(case: str, dtype: torch.dtype) -> None:
    meta, q, k, v, kv = prefill_case(case, dtype, torch.Generator().manual_seed(7))
    groups = cascade.shared_chunks(meta)
    assert [len(g.chunks) for g in groups] == [4 if case == MIXED else 5]
    assert torch.equal(groups[0].blocks, meta.prefills[0].block_ids[:10])

    got = torch.full_like(q, float("nan"))
    get_backend("cpu").prefill_into(got, q, k, v, kv, meta, 0.125)
    want = torch.full_like(q, float("nan"))
    get_backend("torch").prefill_into(want, q, k, v, kv, meta, 0.125)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 8e-3}
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_the_engine_keeps_the_oracles_tokens_with_cascade(tiny_model_dir, monkeypatch) -> None:
    model_dir = tiny_model_dir("llama")
    calls = []
    real = cascade.shared_attention
    monkeypatch.setattr(cascade, "shared_attention", lambda q, *a: calls.append(q) or real(q, *a))
    llm = LLM(model_dir, num_kv_blocks=512)
    rng = random.Random(5)
    vocab = llm.engine.model_config.vocab_size
    system = [rng.randrange(3, vocab) for _ in range(170)]
    prompts = [system + [rng.randrange(3, vocab) for _ in range(n)] for n in (1, 4, 9, 16, 30, 2)]
    params = SamplingParams(max_tokens=10, temperature=0.0)
    outs = llm.generate(prompts, params)
    # Both kinds: the prompts' chunks (rows of several tokens) and the decode rows (one each).
    assert {len(q) for q in calls} >= {len(prompts)}, "no decode step attended the prefix once"
    assert any(len(q) > len(prompts) for q in calls), "no prompt chunks attended it once"
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(prompt), 10)
