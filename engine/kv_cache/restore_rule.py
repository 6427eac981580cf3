"""Restore or recompute: which KV offload tiers a worker keeps, measured on the worker.

A prefix hit in an offload tier saves recomputing the block's prefill and costs copying the
block back. On a CPU the copy always wins by far (bench/engine/offload.py: ~14 us a block from
either tier against ~2 ms to recompute it); on a GPU it need not: a GPU prefills a block of
a mid-sized model in about a millisecond, while a disk tier reads the same block at NVMe
speed, and a host tier over PCIe. So at start-up each worker measures both, once:

    recompute_s = the prefill of one CALIBRATION_TOKENS-token chunk / its blocks
    restore_s[t] = copying that many blocks back from tier t / the blocks

and keeps the tiers, host first, while restore_s[t] < recompute_s; a tier that loses is not
attached, nor any below it (a block reaches the disk tier only through the host tier). With
no host tier left, swap preemption falls back to recompute too: swap is chosen over recompute
only where it is cheaper. The chunk is prefilled from position 0, the cheapest a
block's recompute gets (later blocks also attend to more context), so the rule leans towards
recomputing; the disk tier is read back just after being written (the page cache), as a
recently spilled block is, so a block read from the device itself costs more than measured.

Every TP rank measures its own shard and all take the slowest rank's times
(`max_over_ranks`): the ranks run the same scheduler in lockstep, so they must keep the same
tiers. Each measurement is the faster of two runs (the first builds kernels, faults pages).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.kv_cache.offload import KVOffload
from engine.memory_profile import prefill_batch
from engine.parallel import SINGLE, TPGroup

if TYPE_CHECKING:
    from core.config import EngineConfig
    from engine.kv_cache.block_pool import BlockPool
    from engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)

CALIBRATION_TOKENS = 256


def attach_offload(
    pool: BlockPool, runner: ModelRunner, config: EngineConfig, tp: TPGroup = SINGLE
) -> None:
    """The configured tiers under `pool`, those that win: none when the host tier loses."""
    offload = KVOffload.sized(
        runner.kv_cache, config.kv_offload_host_bytes, config.kv_offload_disk_bytes,
        config.kv_offload_dir,
    )  # fmt: skip
    tokens = min(CALIBRATION_TOKENS, runner.model_config.max_position_embeddings)
    if keep_winning_tiers(offload, runner.model, tp, tokens):
        pool.attach(offload)


def keep_winning_tiers(
    offload: KVOffload,
    model: Callable[..., torch.Tensor],
    tp: TPGroup = SINGLE,
    tokens: int = CALIBRATION_TOKENS,
) -> int:
    """Measure, and drop the tiers (from the first that loses down) whose copy back costs
    more than recomputing a block of a `tokens`-token prefill; returns how many are kept
    (0: attach none)."""
    n = max(1, min(tokens // offload.kv.shape[3], offload.kv.shape[1]))  # blocks
    measured = [_recompute_s(offload, model, n)]
    measured += [_restore_s(offload, i, n) for i in range(len(offload.tiers))]
    # Nanoseconds: the collective reduces integers.
    recompute_ns, *restore_ns = tp.max_over_ranks(
        [round(s * 1e9) for s in measured], offload.kv.device
    )
    kept = 0
    while kept < len(restore_ns) and restore_ns[kept] < recompute_ns:
        kept += 1
    for i, (tier, ns) in enumerate(zip(offload.tiers, restore_ns, strict=True)):
        tier.restore_block_s = ns / 1e9  # what a queued restore counts (offload.py)
        logger.info(
            "KV offload: a block restored from the %s tier in %.1f us, recomputed in %.1f us: "
            "%s", tier.name, ns / 1e3, recompute_ns / 1e3, "kept" if i < kept else "dropped",
        )  # fmt: skip
    offload.keep_tiers(kept)
    return kept


def _recompute_s(offload: KVOffload, model: Callable[..., torch.Tensor], n: int) -> float:
    """Seconds per block of an n-block prefill from position 0 into the (still empty) cache."""
    kv, block_size = offload.kv, offload.kv.shape[3]
    input_ids, positions, meta = prefill_batch([n * block_size], block_size, kv.device)
    with torch.inference_mode():
        return _fastest(lambda: model(input_ids, positions, kv, meta), kv.device) / n


def _restore_s(offload: KVOffload, tier: int, n: int) -> float:
    """Seconds per block to copy n blocks back from tier `tier` (its slots and the cache's
    blocks are all free now; what they hold does not matter)."""
    storage = offload.tiers[tier].storage
    n = min(n, storage.shape[0])
    queued = offload.queued and tier == 0  # as restores from it are (offload.py)

    def copy_back() -> None:
        for i in range(n):
            offload.kv[:, i].copy_(storage[i], non_blocking=queued)

    for i in range(n):  # as a spilled block would be: written first
        storage[i].copy_(offload.kv[:, i])
    return _fastest(copy_back, offload.kv.device) / n


def _fastest(run: Callable[[], object], device: torch.device) -> float:
    times = []
    for _ in range(2):
        _synchronize(device)
        start = time.perf_counter()
        run()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
