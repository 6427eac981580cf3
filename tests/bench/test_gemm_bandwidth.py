"""bench.engine.gemm_bandwidth: the decode GEMMs' pass over the small preset's weights, timed."""

from __future__ import annotations

import pytest
import torch

from bench.engine import gemm_bandwidth
from engine.layers import cpu_gemm


@pytest.mark.skipif(
    not cpu_gemm.enabled(torch.device("cpu"), torch.float32), reason="no CPU GEMM kernels"
)
def test_a_pass_reads_every_layers_weights_once() -> None:
    result = gemm_bandwidth.run(rows=4, threads=1, dtype=torch.float32)
    per_layer = (768 + 512) * 768 + 768 * 768 + 2 * 2048 * 768 + 768 * 2048
    assert result["weight_bytes"] == 4 * (12 * per_layer + 32000 * 768)
    assert result["pass_s"] > 0 and result["stream_gb_s"] > 0
    assert result["floor_s"] == pytest.approx(result["weight_bytes"] / 1e9 / result["stream_gb_s"])
