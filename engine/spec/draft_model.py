"""Drafts from a smaller model (speculative decoding's `draft` method): a second checkpoint
with the target's tokenizer runs ahead k tokens a step, and the target verifies them in one
step (engine/spec/speculator.py).

A draft is drawn the way the target will draw that position: the same sampler pipeline
(penalties, bias, temperature, top-k / top-p / min-p) on the draft's logits, and for a
sampled request the same noise, since both draw from the request's position-seeded
generator (an unseeded sampled request gets a seed of the engine's: `Request.sample_seed`).
The target's exponential race picks argmax(p_i / E_i), the draft's argmax(q_i / E_i) with
the same E: where q is close to p they pick the same token far more often than an
independent draw from q would (coupled sampling), and greedy rows are argmax on both sides.

Exact in distribution, and token for token what decoding without drafts emits: the target
emits its own samples up to the first that differs from its draft, each drawn from its own
distribution with its own position's noise, so the drafts decide only how many tokens a step
keeps, never which (the speculator's module docstring). What this gives up against rejection
sampling with q (accept with min(1, p/q), else draw from max(0, p - q)): nothing in
acceptance for greedy requests, and for sampled ones the coupled race's match rate, which is
lower than the sum of min(p, q) but keeps every seeded token what plain decoding gives.

The draft runs through the engine's own model, layers, kernels and attention backend, over a
paged KV cache of its own in which each of `max_seqs` slots owns a fixed run of blocks (no
allocator: a slot's block table is a constant range). A slot remembers the tokens its cache
holds; each step feeds only what the request gained since (the bonus token, and the last
draft when all were accepted); rejected drafts' entries are simply overwritten. A request
that has no slot takes a free one, or the least recently used one that is not drafting in this
step; a request whose context no longer fits the draft's positions gets no drafts. Under
tensor parallelism every rank runs the whole draft (it is small) and draws the same drafts.

Memory: max_seqs x max_len tokens of the draft's KV, allocated up front (the `draft`
preset: 2 layers x 1 KV head x 64 dims, 32 MiB in float32 for 16 x 2048).
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from core.kv_layout import KVLayout, dtype_name
from engine.attention.backend import AttentionMetadata, PrefillChunk
from engine.attention.registry import get_backend
from engine.checkpoint import iter_weights, num_elements
from engine.config import ModelConfig
from engine.cpu_forward import CPUForward
from engine.kv_cache.manager import cdiv
from engine.kv_cache.tensor import allocate_kv_cache
from engine.layers import cpu_gemm
from engine.models import build_model
from engine.sampler import Sampler
from engine.sampling.rows import sampling_row

if TYPE_CHECKING:
    from engine.request import Request

logger = logging.getLogger(__name__)

MAX_DECODE_ROWS = 8
"""New tokens a request may feed as decode rows (one per position, the decode kernels): what
it gained since its last drafts is one or two; a new request's whole context goes as a
prefill chunk."""


@dataclass
class _Slot:
    owner: Request
    tokens: list[int] = field(default_factory=list)
    """What the slot's cache holds, position by position."""
    real: int = 0
    """Leading `tokens` known to be the request's own (not drafts that may be rejected)."""


@dataclass
class _Row:
    slot: int
    request: Request
    new: list[int]
    """Tokens to feed this forward."""
    room: int
    drafts: list[int] = field(default_factory=list)


def draft_device_bytes(
    model_dir: str | Path, dtype: torch.dtype, max_seqs: int, max_len: int, block_size: int = 16
) -> int:
    """What a `DraftModel` of these arguments takes of its device: its weights (every tensor
    of its checkpoint, in `dtype`) and its KV cache. The target's KV cache is sized with it
    set aside (engine/memory_profile.py), since the draft loads after that cache exists."""
    cfg = ModelConfig.from_dir(model_dir)
    elements = num_elements(cfg.model_dir)
    blocks_per_slot = cdiv(min(max_len, cfg.max_position_embeddings), block_size)
    layout = KVLayout(num_layers=cfg.num_hidden_layers, num_blocks=max_seqs * blocks_per_slot,
                      block_size=block_size, num_kv_heads=cfg.num_key_value_heads,
                      head_dim=cfg.head_dim, dtype=dtype_name(dtype))  # fmt: skip
    element_size = torch.empty(0, dtype=dtype).element_size()
    return elements * element_size + layout.num_blocks * layout.block_bytes_all_layers


class DraftModel:
    def __init__(
        self,
        model_dir: str | Path,
        target: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        attention_backend: str,
        max_seqs: int,
        max_len: int,
        block_size: int = 16,
        seed: int = 0,
    ) -> None:
        self.config = cfg = ModelConfig.from_dir(model_dir)
        if cfg.vocab_size != target.vocab_size:
            raise ValueError(
                f"speculative_model {model_dir}: vocab_size {cfg.vocab_size} differs from the "
                f"target's {target.vocab_size} (a draft model must share the tokenizer)"
            )
        self.device = device
        self.block_size = block_size
        self.max_len = min(max_len, cfg.max_position_embeddings)
        self.blocks_per_slot = cdiv(self.max_len, block_size)
        self.model = build_model(cfg, get_backend(attention_backend), dtype, device)
        self.model.load_weights(iter_weights(cfg.model_dir))
        self.model.eval()
        if cpu_gemm.enabled(device, dtype):
            cpu_gemm.enable(self.model)
        layout = KVLayout(
            num_layers=cfg.num_hidden_layers,
            num_blocks=max_seqs * self.blocks_per_slot,
            block_size=block_size,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            dtype=dtype_name(dtype),
        )
        self.kv_cache = allocate_kv_cache(layout, device)
        self.cpu_forward = CPUForward.build(self.model, self.kv_cache)
        """Its forward as one flat run of kernels on CPU, as the target's (None: modules)."""
        self._tables = torch.arange(layout.num_blocks, device=device).view(max_seqs, -1)
        """Each slot's block table: its own constant run of blocks."""
        self.sampler = Sampler(cfg.vocab_size, seed=seed)
        self.max_seqs = max_seqs
        self._slots: OrderedDict[int, _Slot] = OrderedDict()
        """Slot index -> what it holds, least recently used first."""
        logger.info(
            "draft model %s: %d slots of %d tokens (%.1f MiB of KV)",
            cfg.model_id,
            max_seqs,
            self.max_len,
            self.kv_cache.numel() * self.kv_cache.element_size() / (1 << 20),
        )

    @torch.inference_mode()
    def propose(self, wanted: list[tuple[Request, int]]) -> dict[str, list[int]]:
        """Up to `room` drafts for each (request, room), in one batched forward per draft
        position: request_id -> drafts (absent or empty: none this step)."""
        rows: list[_Row] = []
        for slot, req, room in self._assign(wanted):
            context = req.all_token_ids
            room = min(room, self.max_len - len(context))
            if room <= 0:
                continue
            held = self._slots[slot]
            keep = held.real  # then the drafts it held that the request accepted
            while keep < min(len(held.tokens), len(context) - 1):
                if held.tokens[keep] != context[keep]:
                    break
                keep += 1
            rows.append(_Row(slot, req, list(context[keep:]), room))
            held.tokens[keep:] = context[keep:]
            held.real = len(context)
        rows.sort(key=lambda r: len(r.new) > MAX_DECODE_ROWS)  # decode rows first, then chunks
        drafted = {r.request.request_id: r.drafts for r in rows}
        while rows:
            for row, token in zip(rows, self._forward(rows), strict=True):
                row.drafts.append(token)
            rows = [r for r in rows if len(r.drafts) < r.room]
            for row in rows:
                row.new = row.drafts[-1:]
                self._slots[row.slot].tokens.extend(row.new)
        return drafted

    def _assign(self, wanted: list[tuple[Request, int]]) -> list[tuple[int, Request, int]]:
        """A slot for each request (its own, a free one, or the least recently used one not
        wanted now); requests beyond `max_seqs` go without."""
        mine = {id(held.owner): slot for slot, held in self._slots.items()}
        busy = {mine[id(req)] for req, _ in wanted if id(req) in mine}
        free = [s for s in range(self.max_seqs) if s not in self._slots]
        out = []
        for req, room in wanted:
            slot = mine.get(id(req))
            if slot is None:
                if free:
                    slot = free.pop()
                else:
                    slot = next((s for s in self._slots if s not in busy), None)
                    if slot is None:
                        continue
                self._slots[slot] = _Slot(req)
                busy.add(slot)
            self._slots.move_to_end(slot)
            out.append((slot, req, room))
        return out

    def _forward(self, rows: list[_Row]) -> list[int]:
        """Feed each row's new tokens, the last of them at its slot's last position; a draw
        after each row's last token. A few new tokens (every forward but a request's first)
        go as decode rows, one per position over the context up to itself, as the target
        verifies drafts; a new request's whole context as a prefill chunk. Rows with decode
        rows come first (`propose` sorts them), as the layout wants."""
        bs, dev = self.block_size, self.device
        ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        decode_slots: list[int] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        for row in rows:
            end = len(self._slots[row.slot].tokens)
            start = end - len(row.new)
            if len(row.new) <= MAX_DECODE_ROWS:
                decode_slots.extend([row.slot] * len(row.new))
                decode_lens.extend(range(start + 1, end + 1))
            else:
                blocks = self._tables[row.slot, : cdiv(end, bs)]
                prefills.append(PrefillChunk(len(ids), len(row.new), end, blocks))
            ids.extend(row.new)
            positions.extend(range(start, end))
            first = row.slot * self.blocks_per_slot
            slot_blocks.extend(first + p // bs for p in range(start, end))
        # One host-to-device copy for the whole layout; block tables are the slots' own.
        offsets = (p % bs for p in positions)
        packed = torch.tensor(
            [*ids, *positions, *slot_blocks, *offsets, *decode_slots, *decode_lens],
            dtype=torch.long,
        ).to(dev)
        n, d = len(ids), len(decode_lens)
        input_ids, pos, blocks_t, offsets_t = packed[: 4 * n].view(4, n).unbind()
        meta = AttentionMetadata(
            block_size=bs,
            slot_blocks=blocks_t,
            slot_offsets=offsets_t,
            num_decodes=d,
            decode_block_tables=self._tables[
                packed[4 * n : 4 * n + d], : cdiv(max(decode_lens, default=0), bs)
            ],
            decode_seq_lens=packed[4 * n + d :],
            prefills=prefills,
        )
        if self.cpu_forward is not None:
            hidden = self.cpu_forward.run(input_ids, pos, meta)
        else:
            hidden = self.model(input_ids, pos, self.kv_cache, meta)
        if n > len(rows):  # each row's last token
            ends = list(itertools.accumulate(len(row.new) for row in rows))
            hidden = hidden[torch.tensor(ends, device=dev) - 1]
        logits = self.model.compute_logits(hidden)  # the sampler widens them where it must
        return self.sampler(logits, [sampling_row(r.request, r.drafts) for r in rows]).token_ids
