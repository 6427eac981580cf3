"""The router says how right it was, on a real cluster: the index credits the prefill worker
with prompts it never cached (events of a cache it no longer has); the requests routed on
that belief reuse nothing, each an over-estimate; after `max_over` of them the worker's entry
is rebuilt from its snapshot, and the next prediction is exact again."""

from __future__ import annotations

import time

import pytest

from core.events import AllBlocksCleared, BlockStored, KVEventBatch
from core.sampling import SamplingParams
from router.frontdoor.metrics import Metrics
from router.routing.accuracy import AccuracyConfig
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
BLOCKS = 5  # each prompt: 5 full blocks and a tail, all 5 reusable


def test_a_stale_entry_is_found_by_its_mispredictions_and_resynced(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    config = always_disaggregate()
    config = type(config)(**{**config.__dict__, "accuracy": AccuracyConfig(max_over=3)})
    cluster = cluster_factory(make_spec(tiny_model_dir("llama")), config)
    backend, router = cluster.backend, cluster.router
    cluster.use_metrics(metrics := Metrics())
    model = cluster.membership.model.model_id
    [p] = [w for w, m in cluster.membership.workers.items() if m.role == "prefill"]
    phantoms = prompts(5, 1000, [BLOCKS * 16 + 7], seed=5)
    hashes = [router.hash_blocks(model, prompt) for prompt in phantoms]
    stale = [AllBlocksCleared(), *(BlockStored(None, h) for h in hashes)]
    deadline = time.monotonic() + 15
    while cluster.membership.cursor(p) < 0:  # its opening batch first, so ours comes after it
        assert time.monotonic() < deadline, "no KV events from the prefill worker"
        time.sleep(0.05)
    router.apply(KVEventBatch(p, cluster.membership.cursor(p), stale, model=model))

    def blocks(which: str) -> float:
        return metrics.registry.get_sample_value(
            f"baton:router_prefix_{which}_blocks_total", {"worker": p}
        )

    for i, prompt in enumerate(phantoms[:3]):  # believed cached, computed in full
        loop_thread.run(collect(backend, f"stale{i}", prompt, GREEDY))
    get = metrics.registry.get_sample_value
    assert get("baton:router_prefix_mispredictions_total", {"worker": p, "direction": "over"}) == 3
    assert (blocks("predicted"), blocks("reused")) == (3 * BLOCKS, 0)
    assert get("baton:router_index_resyncs_total", {"worker": p}) == 1

    # The snapshot arrives with the next poll: the phantoms not prefilled leave the entry.
    deadline = time.monotonic() + 15
    while router.store.longest_prefixes(model, hashes[4]).reported.get(p, 0):
        assert time.monotonic() < deadline, "the resync never replaced the stale entry"
        time.sleep(0.05)
    loop_thread.run(collect(backend, "after", phantoms[4], GREEDY))
    assert (blocks("predicted"), blocks("reused")) == (3 * BLOCKS, 0)  # exact: 0 and 0
    assert get("baton:router_prefix_mispredictions_total", {"worker": p, "direction": "over"}) == 3
