"""Owns the model, the KV cache tensor and the sampler; turns a scheduled batch into
tensors, runs the forward pass and samples. The only engine component that builds tensors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from core.config import CPU_KV_CACHE_BYTES, KV_CACHE_DTYPES, EngineConfig
from core.device_event import DeviceEvent
from core.kv_layout import KVLayout, dtype_name
from core.request import TokenLogprob
from core.step_stats import StepTotals
from engine import cuda_graphs
from engine.attention.backend import AttentionMetadata, PrefillChunk
from engine.attention.registry import get_backend
from engine.checkpoint import iter_weights
from engine.config import ModelConfig
from engine.cpu_forward import CPUForward
from engine.cuda_graphs import NUM_SCRATCH_BLOCKS, DecodeGraphs, GraphCapturer, choose_capturer
from engine.device import check_cache_dtype, host_to_device
from engine.grammar import token_mask
from engine.int8_checkpoint import prepare_int8_weights
from engine.kv_cache import sizing
from engine.kv_cache.manager import KVCacheManager, cdiv
from engine.kv_cache.tensor import allocate_kv_cache
from engine.kv_connector import LayerHook, layer_written
from engine.layers import cpu_gemm, quant
from engine.lora.manager import LoRAManager
from engine.memory_profile import CudaMemory, DeviceMemory, measure_device_usage
from engine.models import build_model
from engine.parallel import SINGLE, TPGroup
from engine.request import Request
from engine.sampler import Sampled, Sampler
from engine.sampling.prompt_logprobs import add_prompt_logprobs
from engine.sampling.rows import sampling_row
from engine.scheduler import ScheduledBatch
from engine.step_graphs import StepGraphs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampledToken:
    request: Request
    token_id: int
    logprob: TokenLogprob | None


@dataclass(eq=False)
class LaunchedStep:
    """A step given to the device: the positions it samples (request, drafts ahead) and
    its tokens, on the device until `tokens()` brings them to the host."""

    batch: ScheduledBatch
    to_sample: list[tuple[Request, int]]
    sampled: Sampled | None
    ran: DeviceEvent | None = None
    """A step that samples nothing, on CUDA: an event after its forward, which `tokens()`
    waits for, so the blocks freed after it (engine/overlap.py) reach no transfer (which no
    stream orders after the step) while it still writes them."""

    def row_of(self) -> dict[Request, int]:
        """Each request's row in `sampled.tokens` (its token after its last one)."""
        return {r: i for i, (r, ahead) in enumerate(self.to_sample) if ahead == 0}

    def tokens(self) -> list[SampledToken]:
        if self.sampled is None:
            if self.ran is not None:
                self.ran.synchronize()
            return []
        out = self.sampled.result()
        return [
            SampledToken(r, t, lp)
            for (r, _), t, lp in zip(self.to_sample, out.token_ids, out.logprobs, strict=True)
        ]


def _wants_prompt_logprobs(req: Request) -> bool:
    # A request that already has output (resumed, or preempted after its first token)
    # handed its prompt logprobs on already.
    return req.params.prompt_logprobs is not None and not req.output_token_ids


class ModelRunner:
    decode_graphs: DecodeGraphs | None = None
    """Set by `capture_graphs`; None runs decode-only steps eagerly."""
    step_graphs: StepGraphs | None = None
    """Set by `capture_graphs` on a backend that replays whole steps; None runs every other
    step eagerly."""
    _graph_capturer: GraphCapturer | None = None
    graph_pool_bytes = 0
    """What the KV sizing left the graphs' pool (0: no sizing by profile, or no graphs)."""

    def __init__(
        self,
        model_config: ModelConfig,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        attention_backend: str,
        tp: TPGroup = SINGLE,
        device_memory: DeviceMemory | None = None,
    ) -> None:
        """`device_memory`: how the KV sizing reads device memory (default: torch.cuda on
        CUDA; on CPU none, and the cache takes its configured or default size)."""
        self.model_config = model_config
        self.config = config
        self.device = device
        self.dtype = dtype
        self.block_size = config.block_size
        self.tp = tp
        self.attention_backend = attention_backend
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # streams, events and Triton launches use it
        check_cache_dtype(config.kv_cache_dtype, device)
        if device_memory is None and device.type == "cuda":
            # Made before anything is allocated: a shared device's other workers are seen.
            device_memory = CudaMemory(device, shared=config.gpu_fraction < 1)
        start = time.monotonic()
        self.model = build_model(model_config, get_backend(attention_backend), dtype, device, tp)
        # An INT8 checkpoint loads as int8 (`int8` unless w8a8 was asked for).
        method = config.quantization or model_config.quantization
        if model_config.quantization and method:
            count = prepare_int8_weights(self.model, method)
            logger.info("%d linear layers load INT8 weights (%s)", count, method)
        self.model.load_weights(iter_weights(model_config.model_dir))
        self.model.eval()
        if method and not model_config.quantization:
            count = quant.quantize_model(self.model, method)
            logger.info("%d linear layers quantized to %s", count, method)
        quant.finish(self.model)
        if cpu_gemm.enabled(device, dtype):
            logger.info("%d linear layers on the CPU GEMM path", cpu_gemm.enable(self.model))
        self.lora = None
        """The LoRA adapters' slots (engine/lora); None: the base model only."""
        if config.max_loras:
            self.lora = LoRAManager(self.model, config.max_loras, config.max_lora_rank, dtype)
        took = time.monotonic() - start
        logger.info("loaded %s (%s, %s) in %.1f s", model_config.model_id,
                    model_config.architecture, dtype_name(dtype), took)  # fmt: skip
        attn = self.model.model.layers[0].self_attn
        per_block = KVLayout(
            num_layers=model_config.num_hidden_layers,
            num_blocks=1,  # the number that fits is worked out from this one
            block_size=config.block_size,
            num_kv_heads=attn.num_kv_heads,
            head_dim=model_config.head_dim,
            dtype=KV_CACHE_DTYPES[config.kv_cache_dtype] or dtype_name(dtype),
            tp_rank=tp.rank,
            tp_size=tp.size,
        )
        num_blocks = self._num_kv_blocks(per_block, device_memory)
        self.kv_layout = replace(per_block, num_blocks=num_blocks)
        """This rank's cache, as the KV transport registers it (hence the TP rank in it)."""
        self.kv_cache = allocate_kv_cache(self.kv_layout, device)
        self.cpu_forward = CPUForward.build(self.model, self.kv_cache)
        """The forward on CPU as one flat run of kernels (None: the modules run it)."""
        if self.cpu_forward is not None:
            logger.info("steps run as one flat run of kernels (engine/cpu_forward.py)")
        self.sampler = Sampler(model_config.vocab_size, seed=config.seed)
        self.layer_event: Callable[[int], DeviceEvent | None] = self._layer_written
        """The event after which a layer's K/V is written (a test may make it late)."""

    def _num_kv_blocks(self, per_block: KVLayout, memory: DeviceMemory | None) -> int:
        """Given blocks, else given bytes, else (on a device) what the device has left after
        a profiling forward, else the CPU default."""
        config = self.config
        if config.num_kv_blocks:
            return config.num_kv_blocks
        if config.kv_cache_memory_bytes is not None:
            return per_block.num_blocks_for_memory(config.kv_cache_memory_bytes)
        if memory is None:
            return per_block.num_blocks_for_memory(CPU_KV_CACHE_BYTES)
        mc = self.model_config
        max_len = min(
            n for n in (mc.max_position_embeddings, config.max_model_len, mc.sliding_window) if n
        )
        graphs = cuda_graphs.records_cuda_graphs(config, self.device, self.attention_backend)
        usage = measure_device_usage(
            self.model, per_block, config, max_len, mc.vocab_size, memory, self.device, self.tp,
            graphs,
        )  # fmt: skip
        self.graph_pool_bytes = usage.graph_pool_bytes
        utilization = config.gpu_memory_utilization * config.gpu_fraction
        size = sizing.size_kv_cache(usage, utilization, per_block.block_bytes_all_layers)
        logger.info("%s", sizing.describe(usage, utilization, size))
        return size.num_blocks

    def execute(
        self,
        batch: ScheduledBatch,
        kv: KVCacheManager,
        layer_done: LayerHook | None = None,
        totals: StepTotals | None = None,
    ) -> list[SampledToken]:
        """Run one step. Returns a token for every request whose tokens are all computed
        after this step (not for a request that only got a chunk of its prompt). Adds the
        forward and sampling time to `totals` (attention too, on CPU)."""
        return self.launch(batch, kv, layer_done, totals).tokens()

    @torch.inference_mode()
    def launch(
        self,
        batch: ScheduledBatch,
        kv: KVCacheManager,
        layer_done: LayerHook | None = None,
        totals: StepTotals | None = None,
        ahead: LaunchedStep | None = None,
    ) -> LaunchedStep:
        """`execute`, without waiting for the tokens: on a device the step may still be
        running when this returns. `ahead`: the step before, whose tokens a request with
        a pending one (`Request.num_pending`) takes as its input here, on the device."""
        inputs = self._prepare(batch, kv, layer_done, ahead)
        if inputs is None:
            return LaunchedStep(batch, [], None)
        input_ids, positions, meta, logits_idx, to_sample = inputs
        if totals is not None and self.device.type == "cpu":
            meta.totals = totals  # kernels run synchronously: host time is their time
        prompt_logprobs = any(_wants_prompt_logprobs(r) for r, _ in batch.items)
        decodes, steps = self.decode_graphs, self.step_graphs
        start = time.perf_counter()
        # A step with LoRA rows runs the modules: their linear layers add the deltas.
        lora = self.lora is not None and self.lora.activate(batch.items) is not None
        replayable = not prompt_logprobs and not lora
        if replayable and decodes is not None and layer_done is None and decodes.can_replay(meta):
            hidden = decodes.replay(input_ids, positions, meta)
        elif replayable and steps is not None and steps.can_replay(meta):
            hidden = steps.replay(input_ids, positions, meta, layer_done)
        elif self.cpu_forward is not None and not lora:
            hidden = self.cpu_forward.run(input_ids, positions, meta)
        else:
            try:
                hidden = self.model(input_ids, positions, self.kv_cache, meta)
            finally:
                if self.lora is not None:
                    self.lora.finish_step()
        forwarded = time.perf_counter()
        if totals is not None:
            totals.forward_s += forwarded - start
        if prompt_logprobs:
            self._prompt_logprobs(batch, hidden)
        if not to_sample:
            return LaunchedStep(batch, [], None, layer_written(self.device))
        # In the model's dtype: the sampler widens them where it needs float32 (not for plain
        # greedy rows, whose argmax is the same on the exact bf16 values: 64 x 32,000 bf16
        # logits, widen + max 1.06 ms against max 0.77).
        logits = self.model.compute_logits(hidden[logits_idx])
        rows = [sampling_row(r, r.draft_token_ids[:ahead]) for r, ahead in to_sample]
        mask = token_mask([r.grammar for r, _ in to_sample], self.sampler.vocab_size)
        sampled = self.sampler.sample(logits, rows, mask)
        if totals is not None:
            totals.sample_s += time.perf_counter() - forwarded
        return LaunchedStep(batch, to_sample, sampled)

    def plan_graphs(self, capturer: GraphCapturer | None = None) -> int:
        """Decide whether steps will replay graphs (`choose_capturer`: `capturer` stands in
        for CUDA's). Returns how many blocks at the end of the KV cache the KV cache manager
        must not be given: the graphs' scratch."""
        backend = self.model.model.layers[0].self_attn.backend.name
        self._graph_capturer = choose_capturer(self.config, self.device, backend, capturer)
        return 0 if self._graph_capturer is None else NUM_SCRATCH_BLOCKS

    def capture_graphs(self, max_model_len: int) -> None:
        """Record the planned graphs (none if none were planned), once, at start-up: on a
        backend that replays whole steps the token-count buckets', then the decode-only
        steps' (unless the config leaves them out), smaller: they reuse the pool's memory."""
        capturer, config = self._graph_capturer, self.config
        if capturer is None or self.decode_graphs is not None or self.step_graphs is not None:
            return
        if self.model.model.layers[0].self_attn.backend.step_graphs:
            self.step_graphs = StepGraphs(
                self.model,
                self.kv_cache,
                capturer,
                max_tokens=config.max_num_batched_tokens,
                max_seqs=config.max_num_seqs,
                max_model_len=max_model_len,
                block_size=self.block_size,
                scratch_block=self.kv_cache.shape[1] - NUM_SCRATCH_BLOCKS,
                dtype=self.dtype,
            )
        if config.decode_graphs:
            self.decode_graphs = DecodeGraphs(
                self.model,
                self.kv_cache,
                capturer,
                max_batch=min(config.max_num_seqs, config.max_num_batched_tokens),
                max_model_len=max_model_len,
                block_size=self.block_size,
                dtype=self.dtype,
            )
        graphs = (self.decode_graphs, self.step_graphs)
        cuda_graphs.check_graph_memory([g.graph_bytes for g in graphs if g], self.graph_pool_bytes)

    def _prompt_logprobs(self, batch: ScheduledBatch, hidden: torch.Tensor) -> None:
        """Every rank runs this (compute_logits may gather across TP ranks)."""
        t = 0
        for req, n in batch.items:
            start = req.num_computed_tokens
            if _wants_prompt_logprobs(req):
                add_prompt_logprobs(req, hidden[t : t + n], start, self.model.compute_logits)
            t += n

    def _layer_written(self, _layer: int) -> DeviceEvent | None:
        return layer_written(self.device)

    def _with_event(self, hook: LayerHook) -> Callable[[int], None]:
        """The model calls its hook with the layer index only; the connector also gets the
        event after which that layer is written."""

        def layer_done(layer: int) -> None:
            hook(layer, self.layer_event(layer))

        return layer_done

    def _prepare(
        self,
        batch: ScheduledBatch,
        kv: KVCacheManager,
        layer_done: LayerHook | None,
        ahead: LaunchedStep | None,
    ) -> (
        tuple[
            torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, list[tuple[Request, int]]
        ]
        | None
    ):
        if not batch.items:
            return None
        pending: list[tuple[int, Request]] = []
        """(row, request): rows whose input is a token the step before left on the device."""
        bs = self.block_size
        dev = self.device
        input_ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        logits_idx: list[int] = []
        to_sample: list[tuple[Request, int]] = []
        """(request, drafts ahead of its last token): every position a request samples."""
        t = 0
        for req, n in batch.items:
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            block_ids = kv.block_ids(req.request_id)
            drafts = req.draft_token_ids
            input_ids.extend(req.all_token_ids[start : end - len(drafts)])
            if req.num_pending and end > req.num_tokens - req.num_pending:
                pending.append((t + n - 1, req))  # its pending token is its last input
                input_ids.append(0)
            input_ids.extend(drafts)
            positions.extend(range(start, end))
            slot_blocks.extend(block_ids[p // bs] for p in range(start, end))
            if n == 1 or drafts:
                # A speculating request is a decode row per position, each seeing the
                # context up to itself (the step writes all its K/V before attention reads):
                # the decode kernels (and graphs), not the prefill path, verify drafts.
                for seq_len in range(start + 1, end + 1):
                    decode_tables.append(block_ids[: cdiv(seq_len, bs)])
                    decode_lens.append(seq_len)
            else:
                block_tensor = host_to_device(block_ids[: cdiv(end, bs)], torch.long, dev)
                prefills.append(PrefillChunk(t, n, end, block_tensor))
            t += n
            if end == req.num_tokens + len(drafts):
                logits_idx.extend(range(t - 1 - len(drafts), t))
                to_sample.extend((req, ahead) for ahead in range(len(drafts) + 1))
        width = max((len(b) for b in decode_tables), default=0)
        table = [b + [0] * (width - len(b)) for b in decode_tables]
        pos = host_to_device(positions, torch.long, dev)
        meta = AttentionMetadata(
            block_size=bs,
            slot_blocks=host_to_device(slot_blocks, torch.long, dev),
            slot_offsets=pos % bs,
            num_decodes=len(decode_tables),
            decode_block_tables=host_to_device(table, torch.long, dev).reshape(len(table), width),
            decode_seq_lens=host_to_device(decode_lens, torch.long, dev),
            prefills=prefills,
            layer_done=None if layer_done is None else self._with_event(layer_done),
        )
        ids = host_to_device(input_ids, torch.long, dev)
        if pending:
            if ahead is None or ahead.sampled is None:
                raise RuntimeError("a request's pending token has no step in flight")
            rows = ahead.row_of()
            into = host_to_device([row for row, _ in pending], torch.long, dev)
            source = host_to_device([rows[req] for _, req in pending], torch.long, dev)
            ids[into] = ahead.sampled.tokens[source]
        idx = host_to_device(logits_idx, torch.long, dev)
        return ids, pos, meta, idx, to_sample
