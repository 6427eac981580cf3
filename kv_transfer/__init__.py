"""kv_transfer: move KV-cache blocks from a prefill worker's cache into blocks a decode
worker reserved, across processes and nodes. Knows nothing of models: it moves registered
byte regions described as (layer, block id).

Module map
    layout.py      (layer, block) pairs -> byte regions, over the cache layout that
                   core/kv_layout.py (`KVLayout`) describes
    handshake.py   versioned compatibility record, PeerInfo, control messages
    api.py         the Transport interface, SendHandle, TransferResult, FailureHook
    transport.py   DriverTransport: the one Transport, an I/O thread over a Driver
    protocol.py    TransferProtocol: the request tables and the protocol state machine,
                   owned by the transport and run on its I/O thread
    requests.py    per-request records of the protocol (a reservation, a send), one per
                   request and role, owned by the I/O thread
    sending.py     the sender's half of the protocol: offering layers (after their device
                   event), acknowledgements, finishing or failing a send
    holds.py       a failed send's source blocks, held while the receiver may read them
    settling.py    failed requests' results, held until the backend released their ops
    driver.py      the backend seam; nixl_driver.py, ucx_driver.py, shm_driver.py (same
                   host: peers map each other's memfd cache), cuda_ipc_driver.py (same
                   host, GPU caches: peers open each other's cache through CUDA IPC),
                   local_driver.py
    unix_messages.py  the same-host backends' control messages, over Unix sockets
    paired.py      PairedTransport: one transport per backend, the backend chosen per peer
    host.py        which processes share a host (boot id, pid and network namespaces)
    env.py         UCX settings for machines without a GPU, applied before UCX starts
    registry.py    backend registry, create_transport() (`auto`: a PairedTransport)

Setup. Each worker registers its ONE cache tensor
`kv[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]` once
(`create_transport(kv, layout, model_id)`; `layout` is the engine's `KVLayout`), so block b
of layer l is one region at `(l * num_blocks + b) * block_bytes`. Workers exchange
`local_metadata()` bytes out of band (Ray calls) and call `add_peer(bytes)` on both sides.
The metadata carries the backend's connection info and a versioned compatibility record
(protocol version, model id, dtype, layers, KV heads, head size, block size, layout, TP
rank/size); any difference is refused with IncompatiblePeerError naming the field.

Protocol (the decode side pulls):
 1. Decode reserves blocks and calls `expect(request_id, dst_block_ids, num_layers,
    timeout_s)` BEFORE handing the ids to the prefill side.
 2. Prefill calls `send(request_id, src_ids, peer, dst_ids, layers)` as soon as `layers`
    are written (once per layer, or once at the end). This only sends a small LayersReady
    message (src ids, dst ids, layers, a tag) and returns a SendHandle.
 3. Decode checks the message against its own state: known request, the same peer as any
    earlier message for it, layers in range and not seen before, dst ids == the
    reservation, src ids inside the sender's registered cache. Then it PULLS the bytes into
    its reserved blocks (nixl: one READ of all regions; ucx: it posts tagged receives into
    the blocks; shm: one native copy of the blocks from the sender's cache, mapped
    read-only; local: a copy), once the reservation's `ready` event (device work still
    touching the blocks: the offload tiers' queued copies) completed.
    Anything else fails the request.
 4. When a pull completes, decode answers LayersDone(layers); the prefill side may reuse
    those source blocks once its SendHandle completes.
 5. When every layer landed, decode reports RECV ok (poll/wait). Nothing reads the
    reserved blocks before that. When every layer was acknowledged, prefill reports SEND ok.

What is enforced where
    - Receiver: destination addresses are computed by the receiver from its reservation
      and its own registration, so a peer can never write outside the reserved blocks
      (with nixl the peer has no write access at all; with ucx only posted receives land).
    - Sender: block ids are bounds-checked against its registration and the peer's
      advertised block count before anything is sent; a READ can only reach memory the
      sender registered (its KV cache).
    - Readers of a sender's cache: any connected peer may READ it (nixl); the cache holds
      KV only, and peers are workers of the same cluster.

Deadlines and failures. Every request has a deadline (receiver: from `expect`; sender:
from its first `send`). A timeout, a refused message, a failed pull, a peer that aborted,
or (nixl) a peer whose connection dropped fails the request on that side: its result is
FAILED with a reason, an Abort message tells the peer (which then fails too, without
waiting for its own deadline), and the FailureHook runs so the engine frees the blocks.
The hook runs only once the backend can no longer touch the blocks (uncancellable nixl
READs are waited out); a sender that gives up while its receiver may still be reading keeps
its source blocks until the receiver answers Stopped, or at most twice the read lease, after
which a pull of them is refused (holds.py). ucxx exposes no per-request cancel: after a
ucx receive times out, a sender that is still alive and did not get the Abort could still
complete a posted receive; a dead sender cannot. A dead peer with ucx is detected at the
deadline; with shm a dead receiver at the sender's next message (broken pipe), a dead
sender at the deadline.

Backends and when to use which: `nixl` and `ucx` work across nodes and, with NIXL, for
VRAM. `shm` is for prefill and decode workers on one host with their caches in host memory:
UCX reaches a peer's memory there only through the kernel (cma, 5-9 GB/s measured), a mapped
memcpy runs at memory speed. `auto` (the default) registers the cache with `shm` (CPU caches)
and the first network backend that works here (nixl, else ucx), and picks per peer at
connect: `shm` for a peer on this host, the network backend for the others (paired.py). A
named backend is used for every peer; `local` moves KV within one process only (tests).
"""

from kv_transfer.api import (
    FailureHook,
    PeerId,
    Role,
    SendHandle,
    TransferError,
    TransferResult,
    Transport,
    UnknownPeerError,
)
from kv_transfer.handshake import PROTOCOL_VERSION, CompatRecord, IncompatiblePeerError
from kv_transfer.layout import pair_regions
from kv_transfer.paired import peer_compat
from kv_transfer.registry import (
    backend_names,
    create_transport,
    register_backend,
    select_backend,
    unavailable_reason,
)

__all__ = [
    "PROTOCOL_VERSION",
    "CompatRecord",
    "FailureHook",
    "IncompatiblePeerError",
    "PeerId",
    "Role",
    "SendHandle",
    "TransferError",
    "TransferResult",
    "Transport",
    "UnknownPeerError",
    "backend_names",
    "create_transport",
    "pair_regions",
    "peer_compat",
    "register_backend",
    "select_backend",
    "unavailable_reason",
]
