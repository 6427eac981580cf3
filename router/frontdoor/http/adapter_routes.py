"""Loading and unloading LoRA adapters at run time (router/frontdoor/adapters.py).

    POST /v1/load_lora_adapter     {"lora_name": ..., "lora_path": ...}   vLLM's endpoints,
    POST /v1/unload_lora_adapter   {"lora_name": ...}                     behind the API key
    GET  /admin/api/adapters                       the same under the admin token, for an
    POST /admin/api/adapters       {"name", "path"}  operator's scripts and the dashboard
    DELETE /admin/api/adapters/{name}

A loaded adapter is listed in /v1/models (its `parent` the base model) and `model` picks it.
Unloading takes the name away from new requests; requests already running under it finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict

from core.errors import InvalidRequestError
from router.frontdoor.adapters import AdapterRegistry, UnknownAdapterError
from router.frontdoor.http.errors import APIError


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None
    """vLLM's clients may send it; names are what Baton keys adapters by."""


class AdminAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    path: str


def _load(adapters: AdapterRegistry, name: str, path: str) -> None:
    try:
        adapters.load(name, path)
    except InvalidRequestError as e:
        field = str(e).split(":", 1)[0] if ":" in str(e) else None
        raise APIError(400, str(e), "invalid_value", field) from e


def _unload(adapters: AdapterRegistry, name: str) -> None:
    try:
        adapters.unload(name)
    except UnknownAdapterError as e:
        raise APIError(404, f"no LoRA adapter is named {name!r}", "not_found", "lora_name") from e


def adapter_routes(
    adapters: AdapterRegistry, dependencies: Sequence[Any], responses: dict
) -> APIRouter:
    """vLLM's two endpoints, behind the API key (`dependencies`)."""
    router = APIRouter(dependencies=list(dependencies), responses=responses)

    @router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load(body: LoadAdapter) -> str:
        _load(adapters, body.lora_name, body.lora_path)
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    @router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload(body: UnloadAdapter) -> str:
        _unload(adapters, body.lora_name)
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."

    return router


def admin_adapter_routes(
    adapters: AdapterRegistry, authorized: Callable[[Request], bool]
) -> APIRouter:
    router = APIRouter(prefix="/admin/api/adapters", include_in_schema=False)

    def listing() -> JSONResponse:
        refs = [adapters.get(n) for n in adapters.names()]
        return JSONResponse(
            {"adapters": [{"name": r.name, "path": r.path, "digest": r.digest} for r in refs if r]}
        )

    def require(request: Request) -> None:
        if not authorized(request):
            raise APIError(401, "admin token required", "invalid_admin_token")

    @router.get("")
    async def state(request: Request) -> JSONResponse:
        require(request)
        return listing()

    @router.post("")
    async def load(body: AdminAdapter, request: Request) -> JSONResponse:
        require(request)
        _load(adapters, body.name, body.path)
        return listing()

    @router.delete("/{name}")
    async def unload(name: str, request: Request) -> JSONResponse:
        require(request)
        _unload(adapters, name)
        return listing()

    return router
