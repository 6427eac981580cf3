"""Prefill on one engine, decode on another, in one process: the KV copied by hand between
the two engines' caches. The prefill engine's KV connector parks every prompt after its first
token and keeps what the prefill worker's connector hands over (prefill_worker/connector.py),
without a transport: the engine's seam (engine/kv_connector.py) exercised on its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.request import EngineRequest, OutputDelta, TokenLogprob
from engine.engine import LLMEngine
from engine.kv_cache import quant
from engine.kv_connector import LayerHook
from engine.request import Request


@dataclass(frozen=True)
class Parked:
    request_id: str
    first_token: int
    logprob: TokenLogprob | None
    block_ids: list[int]
    output: OutputDelta


class ParkingConnector:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.parked: list[Parked] = []
        engine.kv_connector = self

    def take(self) -> list[Parked]:
        parked, self.parked = self.parked, []
        return parked

    def request_prefilled(
        self, req: Request, first_token: int, logprob: TokenLogprob | None, delta: OutputDelta
    ) -> bool:
        block_ids = self.engine.kv.block_ids(req.request_id)
        self.parked.append(Parked(req.request_id, first_token, logprob, block_ids, delta))
        return True

    def forget(self, request_id: str) -> None:
        self.parked = [p for p in self.parked if p.request_id != request_id]

    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        return None

    def end_step(self) -> None:
        pass


def copy_kv(prefill: LLMEngine, decode: LLMEngine, src: list[int], dst: list[int]) -> None:
    """Blocks `src` of the prefill cache into blocks `dst` of the decode cache (quantized as
    the decode engine stores them when its cache is quantized and the prefill's is not)."""
    values = prefill.runner.kv_cache[:, torch.tensor(src)]
    cache = decode.runner.kv_cache
    if values.dtype != cache.dtype:
        values = quant.quantize(values.float(), cache.dtype)
    cache[:, torch.tensor(dst)] = values


def run_disaggregated(prefill: LLMEngine, decode: LLMEngine, request: EngineRequest) -> list:
    """The deltas of `request` prefilled on `prefill` (its connector a ParkingConnector), its
    KV copied in process into `decode`'s reserved blocks, decoded there."""
    connector = prefill.kv_connector
    assert isinstance(connector, ParkingConnector)
    reservation = decode.reserve(request)
    prefill.enqueue(request)
    while not (results := connector.take()):
        prefill.step()
    (result,) = results
    skip = reservation.num_cached_tokens // prefill.config.block_size
    copy_kv(prefill, decode, result.block_ids[skip:], reservation.block_ids[skip:])
    prefill.release(request.request_id)
    deltas = [decode.admit(request.request_id, result.first_token, result.logprob)]
    while decode.has_unfinished():
        deltas += decode.step()
    for engine in (prefill, decode):
        engine.check_invariants()
        assert engine.kv.pool.num_used_blocks == 0
    return deltas
