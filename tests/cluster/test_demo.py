"""`baton demo` on the default model: both turns prefilled on the prefill worker and moved to
the decode worker, the follow-up reusing the first turn's prefix from the prefill cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import EngineConfig
from router.cli import demo
from tests.cluster.conftest import always_disaggregate, make_spec

pytestmark = pytest.mark.slow


def test_demo_follow_up_hits_the_prefill_cache(
    cluster_factory, loop_thread, smollm2_dir: Path, capsys
) -> None:
    engine = EngineConfig(num_kv_blocks=128, max_num_batched_tokens=256, num_threads=1)
    cluster = cluster_factory(make_spec(smollm2_dir, engine=engine), always_disaggregate())
    (first, _), (follow_up, _) = loop_thread.run(demo.chat(cluster.backend, 12), timeout=120)
    assert first.num_cached_tokens == 0
    # The follow-up's prompt opens with the first turn's whole prompt: its full blocks hit.
    assert follow_up.num_cached_tokens >= len(first.prompt_token_ids) // 16 * 16 > 0
    assert cluster.backend.transfers.num_transfers == 2
    printed = capsys.readouterr().out
    assert printed.count("from the prefill worker's cache") == 2
    assert "> " + demo.TURNS[1] in printed
