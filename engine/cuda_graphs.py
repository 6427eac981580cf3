"""Decode steps replayed from CUDA graphs: one graph per batch size in `capture_sizes`,
recorded once at start-up, so a decode step costs a few copies and one launch instead of
the Python and kernel-launch overhead of every layer.

A graph replays fixed kernels on fixed addresses, so a step is copied into static buffers
made at the largest size, and padded up to the next captured size S:

    row            0 .. B-1: the step's decodes      B .. S-1: padding
    K/V slot       its (block, offset)                (scratch block, 0)
    seq len        its context length                 1
    block table    its blocks, then columns left      scratch block, then columns left
    [W columns]    from earlier steps (masked out)    (W = blocks of max_model_len)
    id, position   its own                            left from an earlier step

Padding rows write their K/V into a block no request ever holds (the cache's last: the KV
cache manager is not given it), all into one slot, and attend to that slot; their ids and
positions, left over from earlier steps, can spoil only their own outputs, which are
dropped. So only the slots, lengths and first table column are reset: the fewest copies per
step. Sampling runs after the graph, on the real rows only.

These graphs take decode-only steps (every row one new token, no prefill chunk, no prompt
logprobs); on the Triton backend every other step replays the step graphs of
engine/step_graphs.py, by token count. A prefill engine records only those: its steps are
prompts.
"""

from __future__ import annotations

import bisect
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from core.config import EngineConfig
from core.device_event import DeviceEvent
from engine.attention.backend import AttentionMetadata, DecodeWorkspace
from engine.kv_cache.manager import cdiv

logger = logging.getLogger(__name__)

NUM_SCRATCH_BLOCKS = 1
"""Blocks at the end of the KV cache that the KV cache manager is not given when graphs
are on: the padding rows' scratch."""


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to `max_batch`, and `max_batch` itself (as
    vLLM does: a step pads by at most 7 rows past 8)."""
    sizes = {s for s in (1, 2, 4, 8) if s <= max_batch}
    sizes.update(range(16, max_batch + 1, 8))
    sizes.add(max_batch)
    return sorted(sizes)


class GraphCapturer(ABC):
    """Records work once for replay. `capture` is called once per batch size, largest
    first, with a function that reads and writes only tensors that outlive it."""

    @abstractmethod
    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Record `fn`; the returned callable redoes its work on whatever its tensors hold
        when called."""

    def event(self) -> DeviceEvent | None:
        """An event that a recorded function may record (replays record it again), or None
        where replays run synchronously and need none."""
        return None


class CUDAGraphCapturer(GraphCapturer):
    """`torch.cuda.CUDAGraph`s sharing one memory pool: captured largest first, each reuses
    the pool memory the ones before it freed (a step never holds two graphs' outputs)."""

    def __init__(self, device: torch.device, num_warmups: int = 2) -> None:
        self.device = device
        self.num_warmups = num_warmups
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        with torch.cuda.device(self.device):
            # Warm-up off the default stream, as capture will be: Triton compiles, cuBLAS
            # picks its kernels and the allocator settles before anything is recorded.
            main = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(self.num_warmups):
                    fn()
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                fn()
        return graph.replay

    def event(self) -> DeviceEvent:
        # external: recorded inside a capture, it becomes an event record node of the graph
        # (a plain event would only order the capture's streams).
        return torch.cuda.Event(external=True)


class RerunCapturer(GraphCapturer):
    """Replays by running `fn` again: the static-buffer path with no graph. On CPU it is
    what tests run; on a GPU it tells a capture problem from a padding or buffer one."""

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        return fn


def choose_capturer(
    config: EngineConfig,
    device: torch.device,
    attention_backend: str,
    given: GraphCapturer | None = None,
) -> GraphCapturer | None:
    """What records this engine's graphs, or None to run every step eagerly: the
    given capturer, else CUDA graphs on a CUDA device with the Triton backend (the torch
    backend gathers every column of the fixed-width block table, all of max_model_len,
    each step). None when `config.cuda_graphs` is off."""
    if not config.cuda_graphs:
        return None
    if given is not None:
        return given
    cuda = records_cuda_graphs(config, device, attention_backend)
    return CUDAGraphCapturer(device) if cuda else None


def records_cuda_graphs(config: EngineConfig, device: torch.device, attention_backend: str) -> bool:
    """Whether this engine records CUDA graphs (`choose_capturer`'s default), which the KV
    sizing leaves their memory pool."""
    return config.cuda_graphs and device.type == "cuda" and attention_backend == "triton"


def num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """The decode kernel's split count for a graph of `batch` rows, fixed at capture since
    the steps' lengths are not known yet: as the kernel would pick for the longest context.
    Only the Triton kernel reads it, and it splits only on CUDA."""
    if device.type != "cuda":
        return 1
    from engine.kernels.decode_attention import default_num_splits

    return default_num_splits(batch, num_kv_heads, max_context, device)


def reserved_device_bytes(device: torch.device) -> int | None:
    """What this process's allocator holds on a CUDA device (the graphs' pool shows as its
    growth; another process sharing the GPU does not); None elsewhere. What it caches but
    no tensor holds (the warm-ups' activations) is handed back first: the graphs' own pool
    stays theirs."""
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


def split_workspaces(
    rows: dict[int, int], model: nn.Module, max_context: int, device: torch.device
) -> dict[int, DecodeWorkspace]:
    """Per captured size, given its decode rows, the decode kernel's split count and its
    scratch: one buffer for all sizes (one graph runs at a time), viewed per size."""
    attn = model.model.layers[0].self_attn
    heads, head_dim = attn.num_heads, attn.head_dim
    splits = {s: num_splits(r, attn.num_kv_heads, max_context, device) for s, r in rows.items()}
    most = max(r * splits[s] for s, r in rows.items())
    partial = torch.empty(most * heads * head_dim, dtype=torch.float32, device=device)
    lse = torch.empty(most * heads, dtype=torch.float32, device=device)
    return {
        s: DecodeWorkspace(
            splits[s],
            partial[: r * heads * splits[s] * head_dim].view(r, heads, splits[s], head_dim),
            lse[: r * heads * splits[s]].view(r, heads, splits[s]),
        )
        for s, r in rows.items()
    }


def graph_forward(
    model: nn.Module,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    ids: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
) -> Callable[[], None]:
    """The forward a graph records: `meta`'s buffers in, the final hidden states into `out`."""

    def forward() -> None:
        # Values a backend derives per step (masks) must be derived inside the graph, from
        # the buffers, not kept from a warm-up run.
        meta.backend_state.clear()
        out.copy_(model(ids, positions, kv_cache, meta))

    return forward


@dataclass(frozen=True)
class Recorded:
    replays: dict[int, Callable[[], None]]
    capture_s: float
    graph_bytes: int | None
    """What this process's allocator grew by while they were recorded: the graphs' pool
    (None off CUDA)."""

    def took(self) -> str:
        memory = "" if self.graph_bytes is None else f", {self.graph_bytes / 2**30:.2f} GiB"
        return f"{self.capture_s:.1f} s{memory}"


def record_all(
    capturer: GraphCapturer, forwards: dict[int, Callable[[], None]], device: torch.device
) -> Recorded:
    """Each size's forward recorded, largest first (each reuses the pool memory the larger
    ones freed), timed, with the memory the graphs took."""
    start, before = time.monotonic(), reserved_device_bytes(device)
    replays = {size: capturer.capture(forwards[size]) for size in sorted(forwards, reverse=True)}
    after = reserved_device_bytes(device)
    used = None if before is None or after is None else after - before
    return Recorded(replays, time.monotonic() - start, used)


def check_graph_memory(took: list[int | None], set_aside: int) -> None:
    """Warn where the recorded graphs (each set's device bytes, None off CUDA) took more of
    the device than the KV sizing left them (`set_aside`; 0: the cache's size was given):
    the rest came out of the utilization's margin."""
    used = sum(b for b in took if b is not None)
    if set_aside and used > set_aside:
        logger.warning(
            "CUDA graphs took %.2f GiB, %.2f GiB more than the KV sizing left them: it came "
            "out of the margin --gpu-memory-utilization keeps",
            used / 2**30,
            (used - set_aside) / 2**30,
        )


class DecodeGraphs:
    """The static buffers and one recorded forward pass per capture size. Built once, after
    the KV cache exists; `replay` is then called from the model runner's steps."""

    def __init__(
        self,
        model: nn.Module,
        kv_cache: torch.Tensor,
        capturer: GraphCapturer,
        *,
        max_batch: int,
        max_model_len: int,
        block_size: int,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.max_blocks_per_seq = cdiv(max_model_len, block_size)
        self.scratch_block = scratch = kv_cache.shape[1] - NUM_SCRATCH_BLOCKS
        dev, n = kv_cache.device, self.max_batch
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
            self.positions = torch.zeros(n, dtype=torch.long, device=dev)
            self.slot_blocks = torch.full((n,), scratch, dtype=torch.long, device=dev)
            self.slot_offsets = torch.zeros(n, dtype=torch.long, device=dev)
            self.seq_lens = torch.ones(n, dtype=torch.long, device=dev)
            self.block_tables = torch.full(
                (n, self.max_blocks_per_seq), scratch, dtype=torch.long, device=dev
            )
            # The activations' dtype: a quantized cache holds int8 / fp8, the hidden states not.
            self.hidden = torch.zeros(n, model.config.hidden_size, dtype=dtype, device=dev)
            max_context = self.max_blocks_per_seq * block_size
            workspaces = split_workspaces({s: s for s in self.sizes}, model, max_context, dev)
            forwards = {s: self._forward_fn(s, workspaces[s]) for s in self.sizes}
            recorded = record_all(capturer, forwards, dev)
        self._replays, self.capture_s = recorded.replays, recorded.capture_s
        self.graph_bytes = recorded.graph_bytes
        logger.info(
            "decode graphs for batch sizes %s (block tables %d wide) in %s",
            self.sizes,
            self.max_blocks_per_seq,
            recorded.took(),
        )

    def _forward_fn(self, size: int, workspace: DecodeWorkspace) -> Callable[[], None]:
        meta = AttentionMetadata(
            block_size=self.block_size,
            slot_blocks=self.slot_blocks[:size],
            slot_offsets=self.slot_offsets[:size],
            num_decodes=size,
            decode_block_tables=self.block_tables[:size],
            decode_seq_lens=self.seq_lens[:size],
            decode_workspace=workspace,
        )
        ids, pos = self.input_ids[:size], self.positions[:size]
        return graph_forward(self.model, self.kv_cache, meta, ids, pos, self.hidden[:size])

    def can_replay(self, meta: AttentionMetadata) -> bool:
        """A decode-only step (no prefill chunk) of at most the largest captured size."""
        return not meta.prefills and 0 < meta.num_decodes <= self.max_batch

    def replay(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The step's final hidden states ([B, hidden], a view of the static output: read it
        before the next replay). `meta` is the eager step's (B decodes, no chunk)."""
        assert meta.layer_done is None, "a per-layer hook cannot run inside a graph"
        b = meta.num_decodes
        size = self.sizes[bisect.bisect_left(self.sizes, b)]
        width = meta.decode_block_tables.shape[1]
        assert width <= self.max_blocks_per_seq, f"{width} blocks > max_model_len's"
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slot_blocks[:b].copy_(meta.slot_blocks)
        self.slot_offsets[:b].copy_(meta.slot_offsets)
        self.seq_lens[:b].copy_(meta.decode_seq_lens)
        self.block_tables[:b, :width].copy_(meta.decode_block_tables)
        # Rows a larger earlier step left behind become padding again (see the map above).
        self.slot_blocks[b:size] = self.scratch_block
        self.slot_offsets[b:size] = 0
        self.seq_lens[b:size] = 1
        self.block_tables[b:size, 0] = self.scratch_block
        self._replays[size]()
        return self.hidden[:b]
