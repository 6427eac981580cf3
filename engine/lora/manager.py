"""An engine's LoRA adapters: which are resident in its slots, least recently used out.

`max_loras` slots hold adapters' weights in every layer (engine/lora/weights.py). A request
names its adapter (`core.lora.LoRARef`); the engine checks it on arrival (`check`: the folder
read and refused with the field at fault, before anything is queued), the scheduler keeps a
step's distinct adapters within the slots, and before each step `activate` loads the step's
adapters that are not resident into free slots, or into those of the least recently used
adapters the step does not need. Adapters read from disk are kept in host memory too
(`max_loras` of them beyond the resident ones, least recently used out), so one swapped out
and back costs a copy, not a read.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from core.errors import InvalidRequestError
from core.lora import LoRARef
from engine.device import host_to_device
from engine.lora.adapter import TARGETS, LoRAAdapter, read_adapter
from engine.lora.weights import LoRABatch, LoRAContext, LoRALinear, Rows
from engine.request import Request

logger = logging.getLogger(__name__)

# the model's linear layers -> the projections fused in each, with their `shard_of` part ids
_LAYOUT = (
    ("self_attn", "qkv_proj", (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"))),
    ("self_attn", "o_proj", (("o_proj", None),)),
    ("mlp", "gate_up_proj", (("gate_proj", 0), ("up_proj", 1))),
    ("mlp", "down_proj", (("down_proj", None),)),
)


class LoRAManager:
    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, dtype: torch.dtype) -> None:
        self.max_loras, self.max_rank, self.dtype = max_loras, max_rank, dtype
        self.context = LoRAContext()
        layers = model.model.layers
        self.num_layers = len(layers)
        self.linears: list[LoRALinear] = []
        cfg = model.config
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        self.shapes: dict[str, tuple[int, int]] = {
            "q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
            "o_proj": (hidden, q), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
            "down_proj": (hidden, inter),
        }  # fmt: skip
        """Each projection's full [out, in]: what an adapter's A and B must fit."""
        assert set(self.shapes) == set(TARGETS)
        for i, layer in enumerate(layers):
            for block, name, parts in _LAYOUT:
                linear = getattr(getattr(layer, block), name)
                lora = LoRALinear(linear, i, parts, max_loras, max_rank, self.context, dtype)
                linear.lora = lora
                self.linears.append(lora)
        self._resident: OrderedDict[LoRARef, int] = OrderedDict()
        """Adapter -> its slot, least recently used first."""
        self._host: OrderedDict[LoRARef, LoRAAdapter] = OrderedDict()
        self.loads = 0
        """Adapters copied into a slot since start (a metric: swaps)."""

    @property
    def resident(self) -> list[str]:
        return [ref.name for ref in self._resident]

    def check(self, ref: LoRARef) -> LoRAAdapter:
        """`ref`'s adapter, read if it is not at hand; InvalidRequestError names what is wrong.
        The request keeps it (`Request.lora_weights`), so activating it never reads again."""
        return self._adapter(ref)

    def _adapter(self, ref: LoRARef) -> LoRAAdapter:
        adapter = self._host.get(ref)
        if adapter is None:
            adapter = read_adapter(ref, self.num_layers, self.shapes, self.dtype)
            if adapter.rank > self.max_rank:
                raise InvalidRequestError(
                    f"lora adapter {ref.name!r}: its rank {adapter.rank} exceeds this engine's "
                    f"max_lora_rank {self.max_rank}"
                )
            self._host[ref] = adapter
            while len(self._host) > 2 * self.max_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(ref)
        return adapter

    def activate(self, items: Sequence[tuple[Request, int]]) -> LoRABatch | None:
        """Make this step's adapters resident and group its rows (`items` in the order the
        runner lays them out) by slot; None when no row has an adapter."""
        rows: dict[LoRARef, list[tuple[int, int]]] = {}
        weights: dict[LoRARef, LoRAAdapter] = {}
        t = 0
        for req, n in items:
            if req.lora is not None:
                rows.setdefault(req.lora, []).append((t, t + n))
                weights[req.lora] = req.lora_weights
            t += n
        if not rows:
            self.context.batch = None
            return None
        if len(rows) > self.max_loras:
            raise RuntimeError(
                f"a step holds {len(rows)} adapters; the engine has {self.max_loras} slots "
                "(the scheduler keeps within them)"
            )
        device = self.linears[0].a.device
        groups = [
            (self._slot(weights[ref], rows), _rows(runs, device)) for ref, runs in rows.items()
        ]
        row_slots = None
        if device.type == "cuda":
            slot_of = [-1] * t
            for (slot, _), runs in zip(groups, rows.values(), strict=True):
                for start, end in runs:
                    slot_of[start:end] = [slot] * (end - start)
            row_slots = host_to_device(slot_of, torch.int32, device)
        self.context.batch = LoRABatch(tuple(groups), row_slots)
        return self.context.batch

    def finish_step(self) -> None:
        self.context.batch = None

    def _slot(self, adapter: LoRAAdapter, needed: dict[LoRARef, list[tuple[int, int]]]) -> int:
        ref = adapter.ref
        slot = self._resident.get(ref)
        if slot is not None:
            self._resident.move_to_end(ref)
            return slot
        used = set(self._resident.values())
        free = [s for s in range(self.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:
            old = next(r for r in self._resident if r not in needed)
            slot = self._resident.pop(old)
            logger.debug("LoRA adapter %s leaves slot %d", old.name, slot)
        for linear in self.linears:
            linear.load(slot, adapter)
        self._resident[ref] = slot
        self.loads += 1
        return slot

    def unload(self, name: str) -> bool:
        """Forget every version of the adapter `name` (its slot is reused). True if it was
        here."""
        found = False
        for ref in [r for r in self._resident if r.name == name]:
            self._resident.pop(ref)
            found = True
        for ref in [r for r in self._host if r.name == name]:
            self._host.pop(ref)
            found = True
        return found


def _rows(runs: list[tuple[int, int]], device: torch.device) -> Rows:
    merged = [list(runs[0])]
    for start, end in runs[1:]:
        if start == merged[-1][1]:
            merged[-1][1] = end  # adjacent requests: the scheduler groups them by adapter
        else:
            merged.append([start, end])
    if len(merged) == 1:
        return slice(*merged[0])
    index = [i for start, end in runs for i in range(start, end)]
    return host_to_device(index, torch.long, device)
