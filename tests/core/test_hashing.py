"""The one block hash: pinned golden values (a change here invalidates every cache and index
in a running cluster, so it must be deliberate) and its chaining properties."""

import pytest

from core.hashing import hash_block, hash_prompt_blocks, model_root_hash

ROOT = model_root_hash("golden-model", 16)


def test_golden_vectors() -> None:
    assert ROOT == 15514795976992119045
    assert hash_prompt_blocks(list(range(40)), 16, ROOT) == [
        18203192461451202034,
        12503984198133049630,
    ]
    assert hash_block(ROOT, [1, 2, 3], b"lora:7") == 10926388165734347490


def test_only_full_blocks_are_hashed() -> None:
    assert hash_prompt_blocks(list(range(15)), 16, ROOT) == []
    assert len(hash_prompt_blocks(list(range(47)), 16, ROOT)) == 2


def test_chain_depends_on_every_earlier_token() -> None:
    a = hash_prompt_blocks([1] * 32, 16, ROOT)
    b = hash_prompt_blocks([2] + [1] * 31, 16, ROOT)
    assert a[0] != b[0] and a[1] != b[1]


def test_shared_prefix_shares_hashes() -> None:
    a = hash_prompt_blocks(list(range(48)), 16, ROOT)
    b = hash_prompt_blocks(list(range(32)) + [7] * 16, 16, ROOT)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_resume_equals_full() -> None:
    tokens = list(range(100))
    full = hash_prompt_blocks(tokens, 16, ROOT)
    head = hash_prompt_blocks(tokens[:40], 16, ROOT)
    rest = hash_prompt_blocks(tokens, 16, ROOT, start_parent=head[-1], start_block=len(head))
    assert head + rest == full


def test_model_identity_and_extra_change_the_hash() -> None:
    other = model_root_hash("other-model", 16)
    assert hash_prompt_blocks([1] * 16, 16, ROOT) != hash_prompt_blocks([1] * 16, 16, other)
    assert model_root_hash("golden-model", 32) != ROOT
    assert hash_block(ROOT, [1] * 16, b"x") != hash_block(ROOT, [1] * 16)


def test_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        model_root_hash("m", 0)
