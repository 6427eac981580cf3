"""Routing under LoRA adapters (router/routing/adapters.py): a request goes to a worker that
holds its adapter, else to one with a free slot, in both pools; a hot adapter spreads to a
free slot once its holders are loaded; an adapter's blocks never count as another's."""

from __future__ import annotations

from core.events import BlockStored, KVEventBatch, WorkerLoad
from core.hashing import hash_prompt_blocks, model_root_hash
from core.lora import LoRARef
from router.routing.adapters import SPREAD_TOKENS
from router.routing.route import Router, RouterConfig

TOKENS = list(range(640))  # 40 blocks of 16
A = LoRARef("a", "/adapters/a", "00000000000000aa")


def report(router: Router, worker: str, role: str, adapters=(), max_loras=2, waiting=0) -> None:
    router.report_load(WorkerLoad(
        worker, role, 0, 0, waiting, 1000, 1000, timestamp=1.0, adapters=tuple(adapters),
        max_loras=max_loras,
    ))  # fmt: skip


def make_router() -> Router:
    router = Router(RouterConfig(disagg_min_uncached_tokens=0))
    for w, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")):
        router.add_worker(w, role, "m")
    return router


def route(router: Router, adapter: str | None, tokens=TOKENS) -> tuple[str | None, str]:
    extra = b"" if adapter is None else A.hash_extra
    hashes = router.hash_blocks("m", tokens, (), extra)
    with router.route("m", block_hashes=hashes, num_prompt_tokens=len(tokens),
                      adapter=adapter) as ticket:  # fmt: skip
        decision = ticket.decision
        return decision.prefill_worker_id, decision.decode_worker_id


def test_requests_go_to_the_workers_holding_their_adapter() -> None:
    router = make_router()
    for w, role in (("p0", "prefill"), ("d0", "decode")):
        report(router, w, role, adapters=("x", "y"))  # full, without "a"
    for w, role in (("p1", "prefill"), ("d1", "decode")):
        report(router, w, role, adapters=("a",))
    assert {route(router, "a") for _ in range(4)} == {("p1", "d1")}
    # Base-model requests still use every worker.
    assert len({route(router, None) for _ in range(8)}) > 1


def test_a_new_adapter_goes_where_a_slot_is_free_and_stays_there() -> None:
    router = make_router()
    report(router, "p0", "prefill", adapters=("x", "y"))
    report(router, "p1", "prefill", adapters=("x",))
    report(router, "d0", "decode", adapters=("x",))
    report(router, "d1", "decode", adapters=("x", "y"))
    first = route(router, "a")
    assert first == ("p1", "d0")
    assert route(router, "a") == first  # routed there: held from now on, before any report


def test_a_hot_adapter_spreads_once_its_holder_is_loaded() -> None:
    router = make_router()
    report(router, "p0", "prefill", adapters=("a",), waiting=SPREAD_TOKENS + 2000)
    report(router, "p1", "prefill", adapters=())
    report(router, "d0", "decode", adapters=("a",))
    report(router, "d1", "decode", adapters=())
    assert route(router, "a")[0] == "p1"
    report(router, "p0", "prefill", adapters=("a",), waiting=SPREAD_TOKENS - 2000)
    report(router, "p1", "prefill", adapters=())
    assert route(router, "a")[0] == "p0"  # within the spread: the holder keeps it


def test_an_adapters_blocks_are_not_the_base_models() -> None:
    router = make_router()
    for w, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")):
        report(router, w, role, adapters=("a",))
    base = hash_prompt_blocks(TOKENS, 16, model_root_hash("m", 16))
    router.apply(KVEventBatch("p1", 0, [BlockStored(None, base)], model="m"))
    assert route(router, None)[0] == "p1"  # the base model's prefix is on p1
    hashes = router.hash_blocks("m", TOKENS, (), A.hash_extra)
    assert not set(hashes) & set(base)
    with router.route("m", block_hashes=hashes, num_prompt_tokens=640, adapter="a") as ticket:
        assert ticket.decision.prefill_cached_blocks == 0
