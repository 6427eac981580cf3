"""`baton serve`: start (or join) Ray, bring up the pools, serve HTTP and gRPC until Ctrl-C.

With no arguments: a local single-node Ray, the default model (router/cli/model_dir.py:
SmolLM2-135M-Instruct, imported on first run), one prefill and one decode worker on CPU, the
in-process prefix index.
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

from router.cli.config.serve import ServeConfig
from router.cli.model_dir import resolve_model
from router.cli.serve_args import serve_config

if TYPE_CHECKING:
    from router.cluster.spec import ClusterSpec
    from router.routing.route import RouterConfig

logger = logging.getLogger("baton.serve")


def build_spec(args: argparse.Namespace, model_dir: Path | str) -> ClusterSpec:
    """The cluster a parsed `baton serve` asks for, on the checkpoint in `model_dir`."""
    return cluster_spec(serve_config(args), model_dir)


def cluster_spec(config: ServeConfig, model_dir: Path | str) -> ClusterSpec:
    """`config`'s cluster on the checkpoint in `model_dir`, with what only this host can
    resolve: the device (auto: cuda where torch sees one) and the draft checkpoint's folder."""
    device = config.engine.device
    draft = config.engine.speculative_model
    if draft is not None:
        draft = str(resolve_model(draft, "serve --speculative-model"))
    return config.cluster_spec(
        str(model_dir), device if device != "auto" else _detect_device(), draft
    )


def router_config(args: argparse.Namespace) -> RouterConfig:
    return serve_config(args).routing.router_config()


def _parser_for(model_dir: Path | str | None) -> str:
    """The function-call parser of the checkpoint's family (its config.json model_type)."""
    from router.frontdoor.tools.parsers import parser_for_model_type

    model_type = None
    if model_dir is not None:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        model_type = config.get("model_type")
    return parser_for_model_type(model_type)


def _detect_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


async def _serve(config: ServeConfig) -> int:
    from core.errors import InvalidRequestError
    from router.cluster.admin import ControllerAdmin
    from router.cluster.bringup import init_ray, start_cluster
    from router.frontdoor.adapters import AdapterRegistry
    from router.frontdoor.grpc.server import GRPCServer
    from router.frontdoor.http.app import create_app
    from router.frontdoor.limits import DoorControls
    from router.frontdoor.metrics import Metrics

    started = time.monotonic()
    cluster_options, door = config.cluster, config.front_door
    spec = (
        None
        if cluster_options.attach
        else cluster_spec(config, resolve_model(config.model.model, "serve"))
    )
    logger.info("starting Ray (%s)", cluster_options.address or "local, 127.0.0.1")
    init_ray(cluster_options.address)
    if spec is None:
        logger.info("attaching to the running cluster's controller")
    else:
        pools = ", ".join(f"{n} {p}" for p, n in spec.initial_pools().items())
        logger.info("bringing up the pools (%s) for %s", pools, spec.model_dir)
    try:
        cluster = await start_cluster(
            spec, config.routing.router_config(), attach=cluster_options.attach
        )
    except RuntimeError as e:  # the pools did not come up, or the preflight refused a worker
        raise SystemExit(f"baton serve: {e}") from None
    metrics = Metrics()
    cluster.use_metrics(metrics)
    admin = ControllerAdmin(cluster.controller, cluster.membership)
    token = door.admin_token or secrets.token_urlsafe(24)
    tool_call_parser = door.tool_call_parser or _parser_for(spec.model_dir if spec else None)
    controls = DoorControls(config.limits.door_limits())  # one count for both doors
    try:
        adapters = AdapterRegistry(cluster.backend.model_name, config.model.lora_modules)
    except InvalidRequestError as e:
        await cluster.close()
        raise SystemExit(f"baton serve: --lora-modules: {e}") from None
    app = create_app(
        cluster.backend,
        admin,
        api_key=door.api_key,
        admin_token=token,
        metrics=metrics,
        request_timeout_s=door.request_timeout,
        tool_call_parser=tool_call_parser,
        reasoning_parser=door.reasoning_parser,
        cors_origins=tuple(o.strip() for o in door.allowed_origins.split(",") if o.strip()),
        limits=controls,
        tracing=cluster.tracing,
        log_requests_json=config.observability.log_requests_json,
        slow_requests=cluster.slow_requests,
        tenant_header=config.limits.tenant_header,
        adapters=adapters,
    )
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host=door.host, port=door.port, log_level="warning", lifespan="off")
    )
    try:
        grpc_server = await GRPCServer.start(
            cluster.backend, admin, host=door.host, port=door.grpc_port, admin_token=token,
            api_key=door.api_key, metrics=metrics, request_timeout_s=door.request_timeout,
            tool_call_parser=tool_call_parser, limits=controls, tracing=cluster.tracing,
            log_requests_json=config.observability.log_requests_json,
            tenant_header=config.limits.tenant_header, adapters=adapters,
        )  # fmt: skip
    except OSError as e:
        await cluster.close()
        raise SystemExit(f"baton serve: could not serve gRPC on {door.host}:{door.grpc_port}: "
                         f"{e.strerror or e}") from None  # fmt: skip
    http_task = asyncio.create_task(_serve_http(server))
    while not server.started and not http_task.done():
        await asyncio.sleep(0.05)
    if http_task.done():
        await grpc_server.stop()
        await cluster.close()
        raise SystemExit(f"baton serve: could not serve HTTP on {door.host}:{door.port}")
    url = f"http://{door.host}:{door.port}"
    print(
        f"\nBaton is serving {cluster.backend.model_name} ({time.monotonic() - started:.0f} s)\n"
        f'  OpenAI API   {url}/v1   (model "{cluster.backend.model_name}")\n'
        f"  gRPC         {door.host}:{grpc_server.port}\n"
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
    await cluster.close(kill_workers=cluster_options.address is None)
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
    return asyncio.run(_serve(serve_config(args)))
