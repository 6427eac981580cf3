"""`/admin`: the dashboard page and the JSON endpoints it (or an operator's script) calls.

Every route needs the admin token, given as `Authorization: Bearer <token>`, as the
`baton_admin` cookie, or once as `/admin?token=<token>` (the page then sets the cookie,
HttpOnly and SameSite=Strict, so the page's own calls carry it and other sites' don't).
"""

from __future__ import annotations

import hmac
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from core.errors import InvalidRequestError
from router.frontdoor.admin_api import MAX_POOL_SIZE, ClusterAdmin
from router.frontdoor.http.errors import APIError
from router.frontdoor.metrics import Metrics

if TYPE_CHECKING:  # it imports the OpenTelemetry SDK, which only a keeping door needs
    from router.frontdoor.slow_requests import SlowRequests

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
_ASSETS = {
    "admin.js": "text/javascript",
    "slow_requests.js": "text/javascript",
    "admin.css": "text/css",
}
COOKIE = "baton_admin"

_LOGIN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Baton admin</title>
</head><body><h1>Baton admin</h1><p id="refused">Admin token required{why}.</p>
<form method="get" action="/admin"><label>Token <input name="token" type="password"
autocomplete="off"></label> <button type="submit">Open</button></form></body></html>"""


class ScaleBody(BaseModel):
    size: int = Field(ge=0, le=MAX_POOL_SIZE)


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def is_authorized(request: Request, token: str, allow_query: bool = False) -> bool:
    """Whether `request` carries the admin token (see the module's docstring)."""
    offered = [_bearer(request), request.cookies.get(COOKIE)]
    if allow_query:
        offered.append(request.query_params.get("token"))
    return any(o is not None and hmac.compare_digest(o, token) for o in offered)


def admin_router(
    admin: ClusterAdmin | None,
    token: str,
    metrics: Metrics,
    slow_requests: SlowRequests | None = None,
) -> APIRouter:
    router = APIRouter(prefix="/admin", include_in_schema=False)

    def authorized(request: Request, allow_query: bool = False) -> bool:
        return is_authorized(request, token, allow_query)

    def require(request: Request) -> ClusterAdmin:
        if not authorized(request):
            raise APIError(401, "admin token required", "invalid_admin_token")
        if admin is None:
            raise APIError(503, "this server has no cluster admin", "no_admin")
        return admin

    @router.get("", response_class=HTMLResponse)
    async def page(request: Request) -> Response:
        if not authorized(request, allow_query=True):
            why = " (the token given is wrong)" if request.query_params.get("token") else ""
            return HTMLResponse(_LOGIN_PAGE.format(why=why), status_code=401)
        response = FileResponse(STATIC_DIR / "admin.html", media_type="text/html")
        response.headers["Cache-Control"] = "no-store"
        offered = request.query_params.get("token")
        if offered is not None:
            response.set_cookie(COOKIE, offered, httponly=True, samesite="strict", path="/admin")
        return response

    @router.get("/static/{name}")
    async def asset(name: str, request: Request) -> Response:
        if not authorized(request):
            raise APIError(401, "admin token required", "invalid_admin_token")
        if name not in _ASSETS:
            raise APIError(404, f"no asset {name!r}")
        return FileResponse(STATIC_DIR / name, media_type=_ASSETS[name])

    @router.get("/api/state")
    async def state(request: Request) -> JSONResponse:
        cluster = await require(request).state()
        return JSONResponse(asdict(cluster))

    @router.get("/api/stats")
    async def stats(request: Request) -> JSONResponse:
        require(request)
        return JSONResponse(metrics.live.snapshot())

    @router.get("/api/slow-requests")
    async def slow(request: Request) -> JSONResponse:
        """This door's slowest recent requests by TTFT (`ttft`) and end to end (`e2e`),
        each with its door-side spans (router/frontdoor/slow_requests.py); `enabled` false
        with `--slow-requests 0`."""
        if not authorized(request):
            raise APIError(401, "admin token required", "invalid_admin_token")
        if slow_requests is None:
            return JSONResponse({"enabled": False, "ttft": [], "e2e": []})
        return JSONResponse({"enabled": True, **slow_requests.report()})

    @router.post("/api/pools/{pool}/scale")
    async def scale(pool: str, body: ScaleBody, request: Request) -> JSONResponse:
        cluster_admin = require(request)
        await cluster_admin.scale(pool, body.size)
        return JSONResponse(asdict(await cluster_admin.state()))

    @router.post("/api/workers/{worker_id}/drain")
    async def drain(worker_id: str, request: Request) -> JSONResponse:
        cluster_admin = require(request)
        try:
            await cluster_admin.drain(worker_id)
        except InvalidRequestError as e:
            raise APIError(404, str(e), "unknown_worker") from e
        return JSONResponse(asdict(await cluster_admin.state()))

    return router


async def refresh_cluster_metrics(admin: ClusterAdmin, metrics: Metrics) -> None:
    """Copy the cluster state into the per-worker and per-pool gauges (on each scrape)."""
    cluster = await admin.state()
    present = {w.worker_id for p in cluster.pools for w in p.workers}
    for gone in metrics.known_workers - present:
        metrics.forget_worker(gone)
    for pool in cluster.pools:
        metrics.set_pool_size(pool.name, len(pool.workers))
        if pool.autoscale is not None:
            metrics.record_autoscale(pool.name, pool.autoscale)
        for w in pool.workers:
            metrics.record_worker(
                w.worker_id,
                num_running=w.num_running,
                num_waiting=w.num_waiting,
                kv_usage=w.kv_usage,
                prefix_hit_rate=w.prefix_hit_rate,
                num_used_blocks=w.num_total_blocks - w.num_free_blocks,
                num_free_blocks=w.num_free_blocks,
                steps=w.steps,
                pool=pool.name,
            )
