"""The one thing the KV transfer needs from the device: whether work queued so far is done.

On a GPU the model's kernels are only *launched* when its per-layer hook fires; the layer's
K/V lands in the cache later, when the stream reaches those kernels. A transfer posted at
the hook would let the receiver's RDMA READ copy blocks that are not written yet: wrong
tokens, no error. So the hook hands over a `DeviceEvent` recorded on the compute stream
right after the layer, and the transport offers the layer only once it `query()`s true.
`torch.cuda.Event` is one; on the CPU the kernels have run when the hook fires, and the
engine passes None. The receiver takes one too: a reservation whose blocks queued copies
still touch (the offload tiers') is pulled into only once its event completes. Where blocks
are handed back after a step or a copy, the engine waits for such an event (`synchronize`)
first.
"""

from __future__ import annotations

from typing import Protocol


class DeviceEvent(Protocol):
    def query(self) -> bool:
        """True once everything recorded before the event has completed. Never blocks."""

    def synchronize(self) -> None:
        """Wait until everything recorded before the event has completed."""
