"""The preflight rule (core/preflight.py): every field of WorkerFacts refuses a pair, by
name, with both values and why; the layout fields (block size, KV cache dtype, TP size) only
within a pool, a decode worker landing an unlike prefill worker's KV; equal facts pair."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from core.preflight import WHY, PreflightError, WorkerFacts, check_joining, preflight

FACTS = WorkerFacts(
    model_id="tiny-llama-0123456789abcdef",
    weights="fedcba9876543210",
    vocab_size=512,
    tokenizer="00112233aabbccdd",
    num_layers=2,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rope_scaling="",
    block_size=16,
    kv_cache_dtype="float32",
    tp_size=1,
)
OTHER = {
    "model_id": "other-model-0123456789abcdef",
    "weights": "0000000000000000",
    "vocab_size": 1024,
    "tokenizer": "ffffffffffffffff",
    "num_layers": 4,
    "num_kv_heads": 4,
    "head_dim": 32,
    "rope_theta": 500000.0,
    "rope_scaling": '{"factor": 8.0, "rope_type": "llama3"}',
    "block_size": 32,
    "kv_cache_dtype": "int8",
    "tp_size": 2,
    "max_lora_rank": 16,
}
LAYOUT = ("block_size", "kv_cache_dtype", "tp_size")


def test_every_field_has_a_reason_and_a_test_value() -> None:
    names = {f.name for f in fields(WorkerFacts)}
    assert set(WHY) == names
    assert set(OTHER) == names


def test_equal_facts_pair() -> None:
    assert preflight(FACTS, replace(FACTS)) == []


@pytest.mark.parametrize("name", sorted(OTHER))
def test_each_field_refuses_by_name(name: str) -> None:
    decode = replace(FACTS, **{name: OTHER[name]})
    [mismatch] = preflight(FACTS, decode, same_pool=True)
    assert (mismatch.field, mismatch.prefill, mismatch.decode) == (
        name,
        getattr(FACTS, name),
        OTHER[name],
    )
    said = mismatch.message()
    assert said.startswith(f"{name} differs: prefill has {getattr(FACTS, name)!r}, ")
    assert f"decode has {OTHER[name]!r}" in said
    assert mismatch.why in said
    # Across the pools the layout fields pair (the KV lands and is rewritten); the rest never.
    assert ("one pool share one KV layout" in said) == (name in LAYOUT)
    assert bool(preflight(FACTS, decode)) == (name not in LAYOUT)


def test_every_differing_field_is_named() -> None:
    found = preflight(FACTS, replace(FACTS, head_dim=32, block_size=32), same_pool=True)
    assert [m.field for m in found] == ["head_dim", "block_size"]


def test_a_joining_decode_worker_is_refused_naming_both_workers() -> None:
    others = [("prefill-0", "prefill", FACTS)]
    with pytest.raises(PreflightError) as refused:
        check_joining("decode-1", "decode", replace(FACTS, head_dim=32), others)
    said = str(refused.value)
    assert said.startswith("the preflight refuses worker decode-1: head_dim differs: ")
    assert "prefill prefill-0 has 16, decode decode-1 has 32" in said
    assert [m.field for m in refused.value.mismatches] == ["head_dim"]


def test_a_joining_prefill_worker_is_the_prefill_side() -> None:
    others = [("decode-0", "decode", FACTS)]
    with pytest.raises(PreflightError, match="prefill prefill-1 has 4, decode decode-0 has 2"):
        check_joining("prefill-1", "prefill", replace(FACTS, num_kv_heads=4), others)


def test_unlike_pools_pair_but_a_pool_keeps_one_layout() -> None:
    unlike = replace(FACTS, block_size=32, kv_cache_dtype="int8", tp_size=2)
    check_joining("decode-1", "decode", unlike, [("prefill-0", "prefill", FACTS)])
    others = [("prefill-0", "prefill", FACTS), ("decode-0", "decode", unlike)]
    with pytest.raises(PreflightError, match="decode decode-0 has 32, decode decode-1 has 16"):
        check_joining("decode-1", "decode", FACTS, others)


def test_a_matching_worker_joins_and_workers_without_facts_are_not_checked() -> None:
    check_joining("decode-1", "decode", FACTS, [("prefill-0", "prefill", FACTS)])
    check_joining("decode-1", "decode", None, [("prefill-0", "prefill", FACTS)])
    check_joining("decode-1", "decode", FACTS, [("prefill-0", "prefill", None)])
