"""KVLayout's sizing, which the engine allocates by (the offsets and index checks are
tested with the transport that relies on them, tests/kv_transfer/test_layout_handshake.py),
and the room a decode rank's landing areas take (worker/landing.py)."""

import subprocess
import sys

import pytest

from core.kv_layout import KVLayout, dtype_name, first_holders, kv_head_range, landing_bytes

LAYOUT = KVLayout(num_layers=3, num_blocks=1, block_size=4, num_kv_heads=2, head_dim=8)


def test_a_block_costs_its_region_in_every_layer() -> None:
    assert LAYOUT.block_bytes_all_layers == 3 * LAYOUT.block_bytes
    assert LAYOUT.num_blocks_for_memory(10 * LAYOUT.block_bytes_all_layers + 1) == 10
    assert LAYOUT.num_blocks_for_memory(0) == 1  # never an empty cache


def test_dtype_names_match_the_element_sizes() -> None:
    assert dtype_name("torch.bfloat16") == "bfloat16"
    assert KVLayout(1, 1, 1, 1, 1, dtype=dtype_name("torch.float32")).elem_size == 4


def test_importing_it_does_not_import_torch() -> None:
    code = "import sys, core.kv_layout; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(
    "own_tp,sender_tp,sender_heads",
    [
        (1, 2, [4, 4]),  # both prefill ranks' halves land on the one decode rank
        (2, 1, [8]),  # each decode rank's half is read from the prefill rank holding all 8
        (2, 2, [4]),  # rank to rank
        (1, 16, [1] * 8),  # past a rank a head: each head from the first of its two ranks
    ],
)
def test_the_landing_room_is_an_area_per_sender_rank_read(own_tp, sender_tp, sender_heads):
    heads, layers, head_dim, tokens = 8, 4, 64, 1000
    own = KVLayout(layers, 10, 32, heads // own_tp, head_dim, "int8", 0, own_tp)
    held = [kv_head_range(heads, sender_tp, r) for r in range(sender_tp)]
    chosen = first_holders(kv_head_range(heads, own_tp, 0), held)
    assert [len(held[r]) for r in chosen] == sender_heads
    per_head = (tokens // 16) * 16 * 2 * layers * head_dim * 2  # 62 blocks of 16, K and V, bf16
    assert landing_bytes(own, heads, sender_tp, 16, "bfloat16", tokens) == per_head * sum(
        sender_heads
    )
