"""The flags of `baton serve`, in one place: the CLI, the deploy configs' tests and the docs
all read them from here."""

from __future__ import annotations

import argparse

from router.cli.autoscale_args import add_autoscale_arguments
from router.frontdoor.limits import DoorLimits
from router.routing.index.pending import DEFAULT_TTL_S
from router.routing.route import RouterConfig

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 50051


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="local Hugging Face checkpoint folder (default: make the tiny demo model)",
    )
    p.add_argument("--prefill", type=int, default=1, help="prefill workers (disaggregated mode)")
    p.add_argument("--decode", type=int, default=1, help="decode workers (disaggregated mode)")
    p.add_argument(
        "--mode",
        choices=["disaggregated", "unified"],
        default="disaggregated",
        help="unified: every worker runs both phases (the colocated baseline)",
    )
    p.add_argument(
        "--policy",
        default="cache_aware",
        help="prefill routing policy: cache_aware, ttft, least_loaded, round_robin, random",
    )
    p.add_argument(
        "--prefix-pull-gbps",
        type=float,
        default=0.0,
        metavar="GB/S",
        help="with --policy ttft: the KV transfer rate between prefill workers; when set, a "
        "prefill worker may copy a prompt prefix a busy peer caches instead of computing it "
        "(prefix migration; 0, the default: never)",
    )
    p.add_argument(
        "--balance-slack",
        type=float,
        default=None,
        metavar="S",
        help="with --policy ttft: how far over the pool's mean share of placed prefill work a "
        "worker may go and still be chosen (default 0.2; tighter balances long-prompt "
        "traffic better in the simulator, looser keeps more reuse in bursts: "
        "docs/performance.md)",
    )
    p.add_argument(
        "--balance-measured",
        action="store_true",
        help="with --policy ttft: hold the same bound on the engine time the workers report "
        "as well (long-prompt traffic: docs/performance.md)",
    )
    p.add_argument(
        "--balance-room",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --policy ttft: a worker a request would take over that bound comes after "
        "those it fits, least loaded first (on by default; --no-balance-room checks the bound "
        "before the request only: docs/performance.md)",
    )
    p.add_argument("--decode-policy", default="cache_aware", help="decode routing policy")
    p.add_argument(
        "--disagg-min-uncached-tokens",
        type=int,
        default=256,
        metavar="N",
        help="a prompt whose part the decode worker does not cache is shorter than this is "
        "prefilled by the decode worker itself (conditional disaggregation; 0: every prompt "
        "goes through the prefill pool)",
    )
    p.add_argument(
        "--prefix-promise-s",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="S",
        help="a routed prefill's prompt blocks count as its worker's (for the requests "
        "routed after it, by every front door) until the worker reports them, or at most S "
        "seconds (0: only reported blocks count)",
    )
    p.add_argument(
        "--late-binding",
        action="store_true",
        help="route a request when a prefill worker has room for it, not when it arrives: "
        "the decision sees the caches as they are when its prefill can start",
    )
    p.add_argument(
        "--gate-max-skips",
        type=int,
        default=RouterConfig.gate_max_skips,
        metavar="N",
        help="a prefill worker's queue at the front door lets a request whose prefix the worker "
        "caches longer than the head's go first; one passed over N times goes next "
        "(0: first in, first out)",
    )
    p.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="share the prefix index and controller state through Redis",
    )
    p.add_argument(
        "--address",
        default=None,
        help="join an existing Ray cluster ('auto' or host:port); default: start one",
    )
    p.add_argument(
        "--attach",
        action="store_true",
        help="a front-door replica: serve the running Baton cluster at --address, start no "
        "workers (the cluster's settings come from its controller)",
    )
    p.add_argument("--host", default="127.0.0.1", help="front-door bind address")
    p.add_argument("--port", type=int, default=DEFAULT_HTTP_PORT, help="HTTP port")
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="gRPC port")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every worker")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto")
    p.add_argument(
        "--quantization",
        choices=["int8", "w8a8"],
        default=None,
        help="int8: INT8 weight-only linear layers and LM head, quantized on load (a quarter "
        "of fp32's weight bytes per decode step; the embedding stays in --dtype); w8a8: the "
        "same weights, and each GEMM's input rows quantized to int8 on the fly so the "
        "products run on the CPU's int8 units (VNNI / AMX; CPU only)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "int8", "fp8"],
        default="auto",
        help="int8 or fp8 (e4m3): a quantized KV cache, one scale per token and head (a "
        "quarter of fp32's bytes in the cache and on the wire, plus the scales); auto: --dtype",
    )
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        default=None,
        help="speculative decoding on the decode workers (output unchanged): ngram, by "
        "prompt lookup (faster where answers repeat the prompt); draft, from the smaller "
        "checkpoint --speculative-model",
    )
    p.add_argument(
        "--speculative-model",
        default=None,
        metavar="DIR",
        help="with --speculative draft: the draft model's HF folder (same tokenizer; the "
        "same path on every decode node)",
    )
    p.add_argument(
        "--num-speculative-tokens", type=int, default=4, help="drafts per request per step"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (CPU)")
    p.add_argument(
        "--engine-nice",
        type=_nice,
        default=None,
        metavar="N|none",
        help="nice value of each CPU worker's compute threads (e.g. -10; the worker's other "
        "threads get 10 more): the front door's and I/O threads' work waits for the engine's "
        "gaps instead of stalling it; faster tokens, later first tokens where they share "
        "cores (worker/threads.py). Below 0 needs CAP_SYS_NICE. Default none: Ray's priority",
    )
    p.add_argument(
        "--cpu-bind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bind each CPU worker's compute threads to a CPU each, the CPUs fewest of this "
        "host's workers hold first (worker/cpu_claims.py; default on, --no-cpu-bind: the "
        "kernel places them)",
    )
    p.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help="KV cache per worker (per TP rank), GiB; default: on CUDA what "
        "--gpu-memory-utilization leaves after the weights and a profiling forward, on CPU 1",
    )
    p.add_argument(
        "--kv-offload-host-gb",
        type=float,
        default=0.0,
        help="a host-memory tier under each worker's prefix cache (per TP rank), GiB: evicted "
        "KV blocks spill there and come back on a later hit instead of being recomputed",
    )
    p.add_argument(
        "--kv-offload-disk-gb",
        type=float,
        default=0.0,
        help="a local-disk tier under the host tier (per TP rank), GiB",
    )
    p.add_argument(
        "--kv-offload-dir",
        default=None,
        metavar="DIR",
        help="where the disk tier's file goes (unlinked at once); default: the temp directory",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of each GPU a worker fills with weights, activations and KV cache, when "
        "--kv-cache-gb is not given (default 0.9)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=128,
        help="cap on a worker's running sequences (default 128, `vllm serve`'s on CPU: past "
        "saturation a larger batch reads the weights once for more tokens; docs/performance.md, "
        "issue 17's seventeenth look)",
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay decode steps from CUDA graphs captured at start-up, for batch sizes up "
        "to --max-num-seqs (CUDA workers with the Triton kernels; never on CPU); "
        "--no-cuda-graphs runs every step eagerly (vLLM's --enforce-eager)",
    )
    p.add_argument(
        "--transport",
        default="auto",
        help="KV transport: auto, nixl, ucx, shm (workers on one host), local",
    )
    p.add_argument("--api-key", default=None, help="require this bearer token on the API")
    p.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated browser origins allowed to call the API (CORS), e.g. "
        "https://app.example.com; default none",
    )
    p.add_argument(
        "--admin-token",
        default=None,
        help="admin API / dashboard token (default: generated and printed)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="seconds before a request is failed with a deadline error",
    )
    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=("hermes", "llama3_json", "mistral"),
        help="how function calls are read from the model's text (tool_choice auto): hermes "
        "(Hermes, Qwen), llama3_json (Llama 3.1+), mistral; default: by the checkpoint's "
        "model_type (llama: llama3_json, mistral/mixtral: mistral, else hermes)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=("deepseek_r1", "qwen3"),
        help="split <think>...</think> into reasoning_content: deepseek_r1 (the template "
        "opens the block) or qwen3 (the reply does); default off",
    )
    add_limit_arguments(p)
    add_autoscale_arguments(p)


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """Overload and abuse limits of the HTTP and gRPC APIs (router/frontdoor/limits.py); all
    off unless given."""
    g = p.add_argument_group("limits (HTTP and gRPC APIs, counted together; off unless set)")
    g.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="RPS",
        help="requests per second per API key (bearer token; no token: one shared key); "
        "beyond it 429 with Retry-After",
    )
    g.add_argument(
        "--rate-burst",
        type=int,
        default=None,
        help="requests a key may send at once after idling (default: one second's worth)",
    )
    g.add_argument(
        "--max-concurrent-per-key",
        type=int,
        default=None,
        help="requests in flight per API key; beyond it 429",
    )
    g.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=None,
        help="requests in flight on this front door; more wait in the admission queue",
    )
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=0,
        help="requests that may wait for a slot (with --max-concurrent-requests); beyond "
        "it 503 at once",
    )
    g.add_argument(
        "--queue-timeout",
        type=float,
        default=30.0,
        help="seconds a queued request waits for a slot before a 503",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body accepted (HTTP: 413; gRPC: the largest request message)",
    )


def door_limits(args: argparse.Namespace) -> DoorLimits:
    return DoorLimits(
        rate_per_s=args.rate_limit,
        burst=args.rate_burst,
        max_concurrent_per_key=args.max_concurrent_per_key,
        max_concurrent=args.max_concurrent_requests,
        max_queued=args.max_queued_requests,
        queue_timeout_s=args.queue_timeout,
        max_body_bytes=args.max_body_bytes,
    )


def _nice(value: str) -> int | None:
    if value.lower() == "none":
        return None
    try:
        nice = int(value)
    except ValueError:
        nice = None
    if nice is None or not -20 <= nice <= 19:
        raise argparse.ArgumentTypeError(f"a nice value from -20 to 19, or none; got {value!r}")
    return nice
