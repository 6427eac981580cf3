"""`baton serve`: start (or join) Ray, bring up the pools, serve HTTP and gRPC until Ctrl-C.

With no arguments: a local single-node Ray, the tiny demo model (made on first run), one
prefill and one decode worker on CPU, the in-process prefix index.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core import env
from core.config import EngineConfig
from router.cli.autoscale_args import autoscale_config
from router.cli.model_dir import resolve_model
from router.cli.serve_args import door_limits

if TYPE_CHECKING:
    from router.routing.route import RouterConfig

logger = logging.getLogger("baton.serve")


def _env_fallbacks(args: argparse.Namespace) -> None:
    """Secrets may come from the environment (Kubernetes Secrets), not the command line."""
    args.admin_token = args.admin_token or env.ADMIN_TOKEN.get()
    args.api_key = args.api_key or env.API_KEY.get()
    args.redis = args.redis or env.REDIS_URL.get()


def build_spec(args: argparse.Namespace, model_dir: Path):
    from router.cluster.spec import ClusterSpec

    device = args.device if args.device != "auto" else _detect_device()
    kv_bytes = None if args.kv_cache_gb is None else int(args.kv_cache_gb * (1 << 30))
    engine = EngineConfig(
        kv_cache_memory_bytes=kv_bytes,
        kv_offload_host_bytes=int(args.kv_offload_host_gb * (1 << 30)),
        kv_offload_disk_bytes=int(args.kv_offload_disk_gb * (1 << 30)),
        kv_offload_dir=args.kv_offload_dir,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        speculative=args.speculative,
        speculative_model=_draft_model(args),
        num_speculative_tokens=args.num_speculative_tokens,
        tp_size=args.tp,
        cuda_graphs=args.cuda_graphs,
    )
    return ClusterSpec(
        model_dir=str(model_dir),
        mode=args.mode,
        num_prefill=args.prefill if args.mode == "disaggregated" else 0,
        num_decode=args.decode if args.mode == "disaggregated" else args.prefill + args.decode,
        engine=engine,
        transport=args.transport,
        num_threads=args.threads,
        engine_nice=args.engine_nice,
        cpu_bind=args.cpu_bind,
        tp=args.tp,
        device=device,
        redis_url=args.redis,
        local=args.address is None,
        autoscale=autoscale_config(args),
    )


def _parser_for(model_dir: Path | None) -> str:
    """The function-call parser of the checkpoint's family (its config.json model_type)."""
    from router.frontdoor.tools.parsers import parser_for_model_type

    model_type = None
    if model_dir is not None:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        model_type = config.get("model_type")
    return parser_for_model_type(model_type)


def _draft_model(args: argparse.Namespace) -> str | None:
    if (args.speculative == "draft") != (args.speculative_model is not None):
        raise SystemExit("baton serve: --speculative-model goes with --speculative draft")
    return (
        None
        if args.speculative_model is None
        else str(resolve_model(args.speculative_model, "serve --speculative-model"))
    )


def _policy_args(args: argparse.Namespace) -> dict[str, float | bool]:
    """The `ttft` policy's arguments from their flags (an error with any other policy)."""
    given = {}
    if args.prefix_pull_gbps:
        given["--prefix-pull-gbps"] = ("transfer_gbps", args.prefix_pull_gbps)
    if args.balance_slack is not None:
        if args.balance_slack < 0:
            raise SystemExit("baton serve: --balance-slack must be >= 0")
        given["--balance-slack"] = ("balance_slack", args.balance_slack)
    if args.balance_measured:
        given["--balance-measured"] = ("balance_measured", True)
    if args.balance_room is not None:
        flag = "--balance-room" if args.balance_room else "--no-balance-room"
        given[flag] = ("balance_room", args.balance_room)
    if given and args.policy != "ttft":
        raise SystemExit(f"baton serve: {' and '.join(given)} needs --policy ttft")
    return dict(given.values())


def router_config(args: argparse.Namespace) -> RouterConfig:
    from router.routing.route import RouterConfig

    if args.disagg_min_uncached_tokens < 0:
        raise SystemExit("baton serve: --disagg-min-uncached-tokens must be >= 0")
    if args.prefix_promise_s < 0:
        raise SystemExit("baton serve: --prefix-promise-s must be >= 0")
    if args.gate_max_skips < 0:
        raise SystemExit("baton serve: --gate-max-skips must be >= 0")
    return RouterConfig(
        prefill_policy=args.policy,
        decode_policy=args.decode_policy,
        prefill_policy_args=_policy_args(args),
        disagg_min_uncached_tokens=args.disagg_min_uncached_tokens,
        pending_ttl_s=args.prefix_promise_s,
        late_binding=args.late_binding,
        gate_max_skips=args.gate_max_skips,
    )


def _detect_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


async def _serve(args: argparse.Namespace) -> int:
    from router.cluster.admin import ControllerAdmin
    from router.cluster.bringup import init_ray, start_cluster
    from router.frontdoor.grpc.server import GRPCServer
    from router.frontdoor.http.app import create_app
    from router.frontdoor.limits import DoorControls
    from router.frontdoor.metrics import Metrics

    started = time.monotonic()
    if args.attach and not args.address:
        raise SystemExit("baton serve: --attach serves a running cluster: give its --address")
    spec = None if args.attach else build_spec(args, resolve_model(args.model, "serve"))
    logger.info("starting Ray (%s)", args.address or "local, 127.0.0.1")
    init_ray(args.address)
    if spec is None:
        logger.info("attaching to the running cluster's controller")
    else:
        pools = ", ".join(f"{n} {p}" for p, n in spec.initial_pools().items())
        logger.info("bringing up the pools (%s) for %s", pools, spec.model_dir)
    cluster = await start_cluster(
        spec,
        router_config(args),
        attach=args.attach,
    )
    metrics = Metrics()
    cluster.use_metrics(metrics)
    admin = ControllerAdmin(cluster.controller, cluster.membership)
    token = args.admin_token or secrets.token_urlsafe(24)
    tool_call_parser = args.tool_call_parser or _parser_for(spec.model_dir if spec else None)
    controls = DoorControls(door_limits(args))  # one count for both doors
    app = create_app(
        cluster.backend,
        admin,
        api_key=args.api_key,
        admin_token=token,
        metrics=metrics,
        request_timeout_s=args.request_timeout,
        tool_call_parser=tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        cors_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
        limits=controls,
    )
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="off")
    )
    grpc_server = await GRPCServer.start(
        cluster.backend,
        admin,
        host=args.host,
        port=args.grpc_port,
        admin_token=token,
        api_key=args.api_key,
        metrics=metrics,
        request_timeout_s=args.request_timeout,
        tool_call_parser=tool_call_parser,
        limits=controls,
    )
    http_task = asyncio.create_task(_serve_http(server))
    while not server.started and not http_task.done():
        await asyncio.sleep(0.05)
    if http_task.done():
        await grpc_server.stop()
        await cluster.close()
        raise SystemExit(f"baton serve: could not serve HTTP on {args.host}:{args.port}")
    url = f"http://{args.host}:{args.port}"
    print(
        f"\nBaton is serving {cluster.backend.model_name} ({time.monotonic() - started:.0f} s)\n"
        f'  OpenAI API   {url}/v1   (model "{cluster.backend.model_name}")\n'
        f"  gRPC         {args.host}:{grpc_server.port}\n"
        f"  metrics      {url}/metrics\n"
        f"  dashboard    {url}/admin?token={token}\n"
        f"Ctrl-C stops it.\n",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await asyncio.wait(
        [asyncio.create_task(stop.wait()), http_task], return_when=asyncio.FIRST_COMPLETED
    )
    logger.info("shutting down")
    server.should_exit = True
    await grpc_server.stop()
    await cluster.close(kill_workers=args.address is None)
    return 0


async def _serve_http(server: Any) -> None:
    """uvicorn's `serve`, except that a port it cannot bind ends the task instead of the
    event loop: uvicorn calls sys.exit from inside it, which would leave the loop before the
    cluster is closed, and the process up on the cluster's threads."""
    try:
        await server.serve()
    except SystemExit:
        logger.error("the HTTP server stopped (its log line above says why)")


def serve(args: argparse.Namespace) -> int:
    _env_fallbacks(args)
    return asyncio.run(_serve(args))
