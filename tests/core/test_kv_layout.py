"""KVLayout's sizing, which the engine allocates by (the offsets and index checks are
tested with the transport that relies on them, tests/kv_transfer/test_layout_handshake.py)."""

import subprocess
import sys

from core.kv_layout import KVLayout, dtype_name

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
