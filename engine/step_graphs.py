"""Whole steps replayed from CUDA graphs, prompt chunks and decode rows together: one graph
per token-count bucket, recorded at start-up, so a step that holds a prompt costs a few
copies and one launch instead of every layer's kernels launched from Python (on an H100 a
1.1B model's eager prompt step cost 11-16 ms at any length up to 2,048 tokens: the host's
launches, not the card's work).

A graph replays fixed launches, so each kernel's grid is fixed per bucket of T tokens and the
step is copied into static buffers, padded up to T:

    rows            0 .. nd-1: decodes          nd .. n-1: prompt chunks    n .. T-1: padding
    K/V slot        its own                     its own                     (scratch block, 0)
    decode kernel   D = min(T, rows) programs a KV head: rows past nd have context 0, return
    prefill kernel  T // 64 + C tiles: tiles past the step's list name chunk C (no queries)

Padding rows write their K/V into the scratch block (engine/cuda_graphs.py) and nobody attends
to them; their outputs, left in their own rows, are dropped. Rows never mix anywhere else in
a step (linears, norms, rotary act row by row), so padding cannot reach a real row.

Decode-only steps replay the decode graphs (engine/cuda_graphs.py: exact batch sizes, no
prefill launch); these take every other step the Triton backend runs, prompts alone
included, within the buckets' limits (tokens, decode rows, chunks). Prompt logprobs and
LoRA rows run eagerly.

A prefill worker sends each layer's K/V as soon as it is written: the graph records one CUDA
event after each layer (an event record node, `external=True`), and after the replay is
launched the connector's hook gets every layer's event at once, as an eager step gives it
each layer's as it is launched. The next replay records those events again, so the hook
gets each wrapped (`ReplayedLayer`): the graph's event until a later replay is launched,
then an event recorded after this replay's launch: a layer whose send had not been offered
yet waits for this replay's end, not for the next replay to reach the layer. That a launch
re-records the graph's events at once is checked at start-up (`records_at_launch`); where
it does not, every layer waits for its replay's end.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from core.device_event import DeviceEvent
from engine.attention.backend import AttentionMetadata, DecodeWorkspace
from engine.cuda_graphs import GraphCapturer, graph_forward, record_all, split_workspaces
from engine.kv_cache.manager import cdiv
from engine.kv_connector import LayerHook, layer_written

logger = logging.getLogger(__name__)


def token_buckets(max_tokens: int) -> list[int]:
    """16, 32, 64, 96, 128, then steps of 64 to 512, of 128 to 1,024 and of 256 beyond, up
    to `max_tokens`, which is one too: past 256 tokens a step pads by at most a quarter
    (rows the GEMMs compute for nothing), with 19 graphs for a 2,048-token budget."""
    sizes = {s for s in (16, 32, 64, 96) if s < max_tokens}
    for low, high, step in ((128, 512, 64), (512, 1024, 128), (1024, max_tokens, 256)):
        sizes.update(range(low, min(high, max_tokens), step))
    sizes.add(max_tokens)
    return sorted(sizes)


@dataclass(frozen=True, eq=False)
class ReplayedLayer:
    """One layer's written-event of one replay (a DeviceEvent). A later replay records the
    graph's event again, after which it says nothing of this one; then this replay's end
    (`ended`, recorded after its launch, on the same stream) stands in. Never true early:
    a re-recorded event completes after this replay's layer did too."""

    graphs: StepGraphs
    replay: int
    layer: int
    ended: DeviceEvent

    def _event(self) -> DeviceEvent:
        event = self.graphs.events[self.layer]
        return event if event is not None and self.graphs.replays == self.replay else self.ended

    def query(self) -> bool:
        return self._event().query()

    def synchronize(self) -> None:
        self._event().synchronize()


SPIN_CYCLES = 50_000_000
"""~25 ms of the GPU's clock: what `records_at_launch` queues ahead of its replay."""


def records_at_launch(replay: Callable[[], None], event: DeviceEvent, device: torch.device) -> bool:
    """Whether launching a replay re-records `event` (one of its graph's event nodes) at once,
    as CUDA documents it ("each launch of the graph will record event"): a query right after
    the launch must speak of this replay, not the one before, or a layer of a replay would
    be sent as written before it is. Checked at start-up after a first replay, twice, each
    try queued behind ~25 ms of spinning so that it cannot have reached the node (the last
    layer's): the event must not be complete (a slow try is only a try). Every rank replays
    as often whatever it finds (a TP step's collectives must pair up). The replays write only
    the scratch block (the static buffers hold no step)."""
    replay()
    found = []
    for _ in range(2):
        torch.cuda.synchronize(device)
        torch.cuda._sleep(SPIN_CYCLES)
        replay()
        found.append(not event.query())
        torch.cuda.synchronize(device)
    if not any(found):
        logger.warning(
            "a step graph's event nodes report the replay before the last one: a prefill "
            "worker sends a step's KV once the whole step is done, not layer by layer"
        )
    return any(found)


def _tile_rows(model: nn.Module, kv_cache: torch.Tensor, dtype: torch.dtype) -> int:
    """The prefill kernel's query rows a tile on this cache (the launch's, as the eager
    steps' layouts; engine/kernels/prefill_attention.py)."""
    from engine.kernels.prefill_attention import launch_for

    head_dim = model.model.layers[0].self_attn.head_dim
    return launch_for(kv_cache[0], dtype, head_dim, kv_cache.device).block_m


class StepGraphs:
    """The static buffers and one recorded forward pass per token bucket. Built once, after
    the KV cache exists, before the decode graphs (smaller: they reuse the pool's memory; they
    share the scratch block)."""

    def __init__(
        self,
        model: nn.Module,
        kv_cache: torch.Tensor,
        capturer: GraphCapturer,
        *,
        max_tokens: int,
        max_seqs: int,
        max_model_len: int,
        block_size: int,
        scratch_block: int,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.sizes = token_buckets(max_tokens)
        self.max_tokens = self.sizes[-1]
        self.max_decodes = min(max_seqs, self.max_tokens)
        self.max_chunks = min(max_seqs, self.max_tokens)
        self.block_m = _tile_rows(model, kv_cache, dtype)
        self.max_tiles = self.max_tokens // self.block_m + self.max_chunks
        width = cdiv(max_model_len, block_size)
        dev, n, c = kv_cache.device, self.max_tokens, self.max_chunks + 1
        self.num_layers = len(model.model.layers)
        self.events = [capturer.event() for _ in range(self.num_layers)]
        self.replays = 0
        """Replays launched: a `ReplayedLayer` of an earlier one reads its `ended`."""
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
            self.positions = torch.zeros(n, dtype=torch.long, device=dev)
            self.slot_blocks = torch.full((n,), scratch_block, dtype=torch.long, device=dev)
            self.slot_offsets = torch.zeros(n, dtype=torch.long, device=dev)
            self.decode_lens = torch.zeros(self.max_decodes, dtype=torch.long, device=dev)
            self.decode_tables = torch.zeros(self.max_decodes, width, dtype=torch.long, device=dev)
            # Chunk starts, lengths and context lengths, then each tile's chunk and first row:
            # one int32 buffer, so a step's chunk layout is one copy.
            self.index = torch.zeros(3 * c + 2 * self.max_tiles, dtype=torch.int32, device=dev)
            self.chunk_tables = torch.zeros(c, width, dtype=torch.long, device=dev)
            # The activations' dtype: a quantized cache holds int8 / fp8, the hidden states not.
            self.hidden = torch.zeros(n, model.config.hidden_size, dtype=dtype, device=dev)
            self._host_index = torch.zeros(self.index.shape, dtype=torch.int32)
            rows = {t: min(t, self.max_decodes) for t in self.sizes}
            workspaces = split_workspaces(rows, model, width * block_size, dev)
            forwards = {t: self._forward_fn(t, workspaces[t]) for t in self.sizes}
            recorded = record_all(capturer, forwards, dev)
        self._replays, self.capture_s = recorded.replays, recorded.capture_s
        self.graph_bytes = recorded.graph_bytes
        self.layer_events = self.events[-1] is not None and records_at_launch(
            self._replays[self.sizes[0]], self.events[-1], dev
        )
        """Whether a replay's hook gets each layer's own event (else only the replay's end:
        `records_at_launch` found the graph's events lagging)."""
        logger.info(
            "step graphs for %d token buckets %s in %s",
            len(self.sizes),
            self.sizes,
            recorded.took(),
        )

    def _layout(self, tiles: int):
        from engine.kernels.prefill_attention import PrefillLayout

        c, m = self.max_chunks + 1, self.max_tiles
        return PrefillLayout(
            query_starts=self.index[:c],
            query_lens=self.index[c : 2 * c],
            seq_lens=self.index[2 * c : 3 * c],
            block_tables=self.chunk_tables,
            tile_chunks=self.index[3 * c : 3 * c + tiles],
            tile_rows=self.index[3 * c + m : 3 * c + m + tiles],
            block_m=self.block_m,
        )

    def _forward_fn(self, size: int, workspace: DecodeWorkspace) -> Callable[[], None]:
        decodes = min(size, self.max_decodes)
        events = self.events
        meta = AttentionMetadata(
            block_size=self.block_size,
            slot_blocks=self.slot_blocks[:size],
            slot_offsets=self.slot_offsets[:size],
            num_decodes=decodes,
            decode_block_tables=self.decode_tables[:decodes],
            decode_seq_lens=self.decode_lens[:decodes],
            decode_workspace=workspace,
            prefill_layout=self._layout(self._tiles(size)),
            layer_done=None if events[0] is None else lambda i: events[i].record(),
        )
        ids, pos = self.input_ids[:size], self.positions[:size]
        return graph_forward(self.model, self.kv_cache, meta, ids, pos, self.hidden[:size])

    def can_replay(self, meta: AttentionMetadata) -> bool:
        """A step of at most the largest bucket's tokens, decode rows and chunks, whose
        tiles fit its bucket's grid."""
        n, chunks = meta.num_tokens, meta.prefills
        if not 0 < n <= self.max_tokens or meta.num_decodes > self.max_decodes:
            return False
        if len(chunks) > self.max_chunks:
            return False
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        return sum(cdiv(c.query_len, self.block_m) for c in chunks) <= self._tiles(size)

    def _tiles(self, size: int) -> int:
        """The prefill grid's tiles in the graph of `size` tokens."""
        return min(size // self.block_m + self.max_chunks, self.max_tiles)

    def replay(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        layer_done: LayerHook | None = None,
    ) -> torch.Tensor:
        """The step's final hidden states ([n, hidden], a view of the static output: read it
        before the next replay). `meta` is the eager step's; `layer_done` gets each layer's
        index and the event after which its K/V is written, once the replay is launched."""
        n, nd, chunks = meta.num_tokens, meta.num_decodes, meta.prefills
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_blocks[:n].copy_(meta.slot_blocks)
        self.slot_offsets[:n].copy_(meta.slot_offsets)
        self.slot_blocks[n:size] = self.scratch_block
        self.slot_offsets[n:size] = 0
        if nd:
            width = meta.decode_block_tables.shape[1]
            self.decode_tables[:nd, :width].copy_(meta.decode_block_tables)
            self.decode_lens[:nd].copy_(meta.decode_seq_lens)
        self.decode_lens[nd : min(size, self.max_decodes)] = 0
        c, m = self.max_chunks + 1, self.max_tiles
        host = self._host_index.numpy()  # element writes in numpy: ~20x torch's per item
        host[: 3 * c] = 0
        host[3 * c : 3 * c + m] = self.max_chunks  # padding tiles: the chunk of no queries
        tile = 0
        for i, chunk in enumerate(chunks):
            host[i], host[c + i], host[2 * c + i] = (
                chunk.query_start,
                chunk.query_len,
                chunk.seq_len,
            )
            self.chunk_tables[i, : chunk.block_ids.shape[0]].copy_(chunk.block_ids)
            for row in range(0, chunk.query_len, self.block_m):
                host[3 * c + tile], host[3 * c + m + tile] = i, row
                tile += 1
        # Queued, not waited for (a step laid out while the one before runs, engine/overlap.py):
        # a pinned copy of its own, which the caching host allocator keeps until it is read.
        staged = self._host_index
        if self.index.is_cuda:
            staged = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True).copy_(staged)
        self.index.copy_(staged, non_blocking=True)
        self.replays += 1
        self._replays[size]()
        if layer_done is not None:
            ended = layer_written(self.kv_cache.device)
            for i in range(self.num_layers):
                # No graph event (a re-running capturer) or lagging ones: the replay's end,
                # None only off CUDA, where the replay has run by now.
                event = self.events[i] is not None and self.layer_events
                layer_done(i, ReplayedLayer(self, self.replays, i, ended) if event else ended)
        return self.hidden[:n]
