"""Our kernel of cascade attention's shared part (engine/cpu_kernels/shared_attention.cpp), each
build this CPU has (AMX; AVX-512 BF16): queries over shared cache blocks read in place,
against float64 softmax attention; a decode group's result merged into its rows' own
attention; prompt chunks' causal attention; and the engine through the build it runs."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.attention import cascade

BUILDS = {
    name: module
    for name in ("shared_attention_amx", "shared_attention_dot")
    if (module := cpu_kernels.load_available(name)) is not None
}
pytestmark = pytest.mark.skipif(not BUILDS, reason="no AMX or AVX-512 BF16 (or no toolchain)")
ENGINE_RUNS_IT = pytest.mark.skipif(
    cascade.kernel_module() is None, reason="the engine keeps this CPU on the flash path"
)


@pytest.fixture(params=sorted(BUILDS))
def kernel(request):  # type: ignore[no-untyped-def]
    return BUILDS[request.param]


OUT_TOL = {"rtol": 0, "atol": 3e-3}
"""The probabilities meet V in bfloat16 (values here ~N(0, 1)); the log-sum-exps stay float32."""


def reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, Hq, D] over keys / values [S, Hk, D] -> (out [N, Hq, D], lse [N, Hq]), float64."""
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, 1)
    v = values.double().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,shd->nhs", q.double(), k) * scale
    return torch.einsum("nhs,shd->nhd", scores.softmax(-1), v), scores.logsumexp(-1)


def cache_and_blocks(
    num_blocks: int, bs: int, hk: int, d: int, shared: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    kv = torch.randn(num_blocks, 2, bs, hk, d, generator=gen).bfloat16()
    return kv, torch.randperm(num_blocks, generator=gen)[:shared]


@pytest.mark.parametrize(
    ("rows", "hq", "hk", "d", "bs", "shared"),
    [
        (1, 12, 4, 64, 16, 1),  # one sub-tile: half a 32-position product
        (8, 12, 4, 64, 16, 64),  # a tenant's rows on a 1,024-token prompt
        (64, 12, 4, 64, 16, 9),  # 192 queries a head: more than one item's 64
        (5, 8, 8, 128, 32, 5),  # no GQA, D = 128, blocks of 32
        (3, 32, 2, 32, 16, 7),  # 16 heads a KV head, D = 32
        (7, 6, 1, 256, 16, 3),  # the largest head
    ],
)
def test_matches_softmax_attention_over_the_blocks(kernel, rows, hq, hk, d, bs, shared) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + d + shared)
    kv, blocks = cache_and_blocks(80, bs, hk, d, shared, gen)
    q = torch.randn(rows, hq, d, generator=gen).bfloat16()
    out, lse = torch.full((rows, hq, d), float("nan")), torch.full((rows, hq), float("nan"))
    kernel.shared_attention_bf16(q, kv, blocks, d**-0.5, out, lse)
    keys, values = kv[blocks, 0].flatten(0, 1), kv[blocks, 1].flatten(0, 1)
    want, want_lse = reference(q, keys, values, d**-0.5)
    torch.testing.assert_close(out.double(), want, **OUT_TOL)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("d", [64, 128])  # the output in tiles / in memory
def test_scores_rising_along_the_walk_rescale_the_output_mid_walk(kernel, d: int) -> None:
    """Each block's keys larger than the last: every query's max keeps passing its reference
    by more than the slack, so the output is rescaled unit after unit."""
    gen = torch.Generator().manual_seed(d)
    kv = torch.randn(60, 2, 16, 2, d, generator=gen)
    blocks = torch.arange(40)
    kv[blocks, 0] *= torch.linspace(0.5, 12, 40)[:, None, None, None]
    kv = kv.bfloat16()
    q = torch.randn(6, 6, d, generator=gen).bfloat16()
    out, lse = torch.empty(6, 6, d), torch.empty(6, 6)
    kernel.shared_attention_bf16(q, kv, blocks, d**-0.5, out, lse)
    keys, values = kv[blocks, 0].flatten(0, 1), kv[blocks, 1].flatten(0, 1)
    want, want_lse = reference(q, keys, values, d**-0.5)
    scores = torch.einsum("nhd,shd->nhs", q.double(), keys.double().repeat_interleave(3, 1))
    rise = scores.amax(-1) - scores[..., :32].amax(-1)  # past the first unit's max
    assert float(rise.min()) * d**-0.5 > 16  # every query's reference raised at least twice
    # Peaky softmaxes: an output is nearly one V row (values up to ~4), carrying the bf16
    # probability's relative rounding (2^-9).
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-2)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-4)


def test_a_group_merges_into_its_rows_own_attention_and_leaves_the_others(kernel) -> None:
    """Rows 1, 4 and 5 of 7 share 40 blocks; each row's out / lse hold its attention over
    its own positions (12 + row of them): after the call, the group's rows hold attention over
    shared + own, every other row is untouched, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    hq, hk, d, bs = 12, 4, 64, 16
    kv, blocks = cache_and_blocks(100, bs, hk, d, 40, gen)
    q = torch.randn(7, hq, d, generator=gen).bfloat16()
    own = [torch.randn(12 + n, hk, d, generator=gen).bfloat16() for n in range(7)]
    own_v = [torch.randn(12 + n, hk, d, generator=gen).bfloat16() for n in range(7)]
    parts = [reference(q[n : n + 1], own[n], own_v[n], 0.125) for n in range(7)]
    out = torch.cat([o for o, _ in parts]).float()
    lse = torch.cat([s for _, s in parts]).float()
    before_out, before_lse = out.clone(), lse.clone()
    group = torch.tensor([1, 4, 5])
    kernel.shared_attention_bf16(q, kv, blocks, 0.125, out, lse, group, True)
    shared_k, shared_v = kv[blocks, 0].flatten(0, 1), kv[blocks, 1].flatten(0, 1)
    for n in range(7):
        if n in group.tolist():
            keys, values = torch.cat([shared_k, own[n]]), torch.cat([shared_v, own_v[n]])
            want, want_lse = reference(q[n : n + 1], keys, values, 0.125)
            torch.testing.assert_close(out[n : n + 1].double(), want, **OUT_TOL)
            torch.testing.assert_close(lse[n : n + 1].double(), want_lse, rtol=1e-6, atol=1e-5)
        else:
            assert torch.equal(out[n], before_out[n]) and torch.equal(lse[n], before_lse[n])


def test_an_empty_group_leaves_every_row_as_it_was(kernel) -> None:
    kv = torch.randn(10, 2, 16, 4, 64).bfloat16()
    q = torch.randn(3, 12, 64).bfloat16()
    out, lse = torch.randn(3, 12, 64), torch.randn(3, 12)
    before = out.clone(), lse.clone()
    none = torch.zeros(0, dtype=torch.long)
    kernel.shared_attention_bf16(q, kv, torch.tensor([1]), 0.125, out, lse, none, True, none)
    assert torch.equal(out, before[0]) and torch.equal(lse, before[1])


def test_bad_arguments_are_refused_with_a_reason(kernel) -> None:
    kv = torch.randn(10, 2, 16, 4, 64).bfloat16()
    q = torch.randn(3, 12, 64).bfloat16()
    out, lse = torch.empty(3, 12, 64), torch.empty(3, 12)
    call = kernel.shared_attention_bf16
    with pytest.raises(RuntimeError, match="bfloat16 queries and cache"):
        call(q.float(), kv, torch.tensor([1]), 0.125, out, lse)
    with pytest.raises(RuntimeError, match="outside the cache"):
        call(q, kv, torch.tensor([3, 10]), 0.125, out, lse)
    with pytest.raises(RuntimeError, match="distinct rows"):
        call(q, kv, torch.tensor([1]), 0.125, out, lse, torch.tensor([0, 2, 0]), True)
    with pytest.raises(RuntimeError, match="distinct rows"):
        call(q, kv, torch.tensor([1]), 0.125, out, lse, torch.tensor([3]), True)
    with pytest.raises(RuntimeError, match="head size a multiple of 32"):
        call(torch.randn(3, 12, 48).bfloat16(), torch.randn(10, 2, 16, 4, 48).bfloat16(),
             torch.tensor([1]), 0.125, torch.empty(3, 12, 48), lse)  # fmt: skip
    with pytest.raises(RuntimeError, match="last position outside the blocks"):
        call(q, kv, torch.tensor([1, 2]), 0.125, out, lse, None, False, torch.tensor([0, 5, 32]))
    with pytest.raises(RuntimeError, match="one position per row"):
        call(q, kv, torch.tensor([1]), 0.125, out, lse, None, False, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="float32 out"):
        call(q, kv, torch.tensor([1]), 0.125, out.bfloat16(), lse)


@ENGINE_RUNS_IT
def test_decode_uses_it_and_scores_as_the_prefill_does(tiny_model_dir, monkeypatch) -> None:
    """A bfloat16 engine (heads of 32) decoding 6 continuations of one 200-token prompt: the
    decode steps attend the shared prompt through this kernel, and the log-prob each step gives
    its token is the one a prefill of the whole sequence gives it (up to bf16 rounding)."""
    from core.sampling import SamplingParams
    from engine.llm import LLM

    monkeypatch.setattr(cascade, "TILED_RULE", cascade.DecodeRule(4, 128, 0))
    merged = []
    real = cascade.merge_groups_into
    monkeypatch.setattr(
        cascade, "merge_groups_into", lambda out, *a: merged.append(len(out)) or real(out, *a)
    )
    model = tiny_model_dir("llama", hidden_size=128, head_dim=32, dtype="bfloat16")
    llm = LLM(model, dtype="bfloat16", num_kv_blocks=256)
    system = list(range(40, 240))
    prompts = [system + [300 + 7 * i + j for j in range(3 + i)] for i in range(6)]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    outs = llm.generate(prompts, params)
    assert 6 in merged, "no decode step merged the shared prompt on our kernel"
    scored = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    for prompt, out in zip(prompts, outs, strict=True):
        decoded = [lp.logprob for lp in out.logprobs]
        [again] = llm.generate([prompt + list(out.token_ids)], scored)
        prefilled = [lp.logprob for lp in again.prompt_logprobs[len(prompt) :]]
        torch.testing.assert_close(torch.tensor(decoded), torch.tensor(prefilled), atol=0.1, rtol=0)


@ENGINE_RUNS_IT
@pytest.mark.parametrize("cached", [0, 7, 1031])
def test_a_step_s_prompt_chunks_attend_their_context_causally_in_one_call(cached: int) -> None:
    """Three chunks of one step (after two decode rows): 40 new tokens after `cached`
    positions (a partial block among them, NaN in the cache past the sequence), one token
    after 100 cached, 33 without context; their K / V already in the cache, as the backend
    writes them first. The CPU backend runs them in one call of the prefill kernel, straight
    from the cache, and the result is the torch path's."""
    from engine.attention import cpu_paged
    from engine.attention.backend import AttentionMetadata, PrefillChunk
    from engine.attention.registry import get_backend

    gen = torch.Generator().manual_seed(11 + cached)
    bs, hq, hk, d = 16, 12, 4, 64
    kv = torch.randn(300, 2, bs, hk, d, generator=gen).bfloat16()
    free = torch.randperm(300, generator=gen).tolist()
    chunks, k_rows, v_rows, start = [], [], [], 2
    for context, new in ((cached, 40), (100, 1), (0, 33)):
        seq = context + new
        ids = torch.tensor([free.pop() for _ in range(-(-seq // bs))])
        kv[ids[-1], :, seq % bs or bs :] = float("nan")  # the last block past the sequence
        pos = torch.arange(context, seq)
        k_rows.append(kv[ids[pos // bs], 0, pos % bs])
        v_rows.append(kv[ids[pos // bs], 1, pos % bs])
        chunks.append(PrefillChunk(start, new, seq, ids))
        start += new
    k = torch.cat([torch.zeros(2, hk, d).bfloat16(), *k_rows])
    v = torch.cat([torch.zeros(2, hk, d).bfloat16(), *v_rows])
    empty = torch.zeros(0, dtype=torch.long)
    meta = AttentionMetadata(
        block_size=bs, slot_blocks=empty, slot_offsets=empty, num_decodes=2,
        decode_block_tables=torch.zeros(2, 1, dtype=torch.long), decode_seq_lens=empty,
        prefills=chunks,
    )  # fmt: skip
    q = torch.randn(start, hq, d, generator=gen).bfloat16()
    got, want = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    calls = []
    real = cpu_paged._tiled_prefill

    def spy(*a):  # type: ignore[no-untyped-def]
        kernel = real(*a)
        return lambda *args: calls.append(args[4].tolist()) or kernel(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_paged, "_tiled_prefill", spy)
        get_backend("cpu").prefill_into(got, q, k, v, kv, meta, 0.125)
    assert calls == [[40, 1, 33]]  # the query lengths: every chunk, one call
    get_backend("torch").prefill_into(want, q, k, v, kv, meta, 0.125)
    assert got[:2].isnan().all(), "the decode rows are not the prefill's to write"
    assert not got[2:].isnan().any()
    torch.testing.assert_close(got[2:].float(), want[2:].float(), rtol=1.6e-2, atol=1e-2)


def test_the_prefill_kernel_refuses_bad_chunks_with_a_reason(kernel) -> None:
    kv = torch.randn(10, 2, 16, 4, 64).bfloat16()
    q = torch.randn(8, 12, 64).bfloat16()
    out = torch.empty_like(q)
    tables, one = torch.tensor([[1, 2]]), torch.tensor([0])
    call = kernel.prefill_bf16
    with pytest.raises(RuntimeError, match="has rows 0 \\+ 9 of 8"):
        call(q, kv, tables, one, torch.tensor([9]), torch.tensor([20]), 0.125, out)
    with pytest.raises(RuntimeError, match="needs 3 blocks, its table has 2"):
        call(q, kv, tables, one, torch.tensor([8]), torch.tensor([40]), 0.125, out)
    with pytest.raises(RuntimeError, match="outside the cache"):
        call(q, kv, torch.tensor([[1, 10]]), one, torch.tensor([8]), torch.tensor([20]), 0.125, out)
    with pytest.raises(RuntimeError, match="bfloat16 out"):
        call(q, kv, tables, one, torch.tensor([8]), torch.tensor([20]), 0.125, out.float())
    with pytest.raises(RuntimeError, match="int64 contiguous"):
        call(q, kv, tables.int(), one, torch.tensor([8]), torch.tensor([20]), 0.125, out)
