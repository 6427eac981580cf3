"""LoRA adapters at the doors: `--lora-modules` at start, vLLM's load / unload endpoints and
the admin API at run time, /v1/models listing them, `model` picking one on HTTP and gRPC
(greedy tokens equal transformers + peft), and every bad name or folder refused naming its
field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from core.config import EngineConfig
from engine.tokenizer import Tokenizer
from proto.baton.v1 import generate_pb2, generate_pb2_grpc
from router.frontdoor.adapters import AdapterRegistry
from router.frontdoor.http.app import create_app
from tests import oracle
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

PROMPT = [5, 17, 33, 120, 7, 64, 9, 200, 11, 42]
MAX_TOKENS = 6
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def folders(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("http-adapters")
    make = oracle.make_lora_adapter
    return {
        "a": make(str(model_dir), str(out / "a"), 8, (*ATTN, "down_proj"), 11),
        "b": make(str(model_dir), str(out / "b"), 4, ATTN, 12),
    }


@pytest.fixture(scope="module")
def doors(model_dir: Path, folders: dict[str, str]) -> Iterator[tuple[str, int, str]]:
    backend = LocalBackend(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2,
                                                   max_lora_rank=8))  # fmt: skip
    adapters = AdapterRegistry(backend.model_name, [("a", folders["a"])])
    app = create_app(backend, None, admin_token="adm", adapters=adapters)
    http = HTTPServerThread(app).start()
    grpc_server = GRPCServerThread(backend, None, admin_token="adm", adapters=adapters).start()
    yield http.url, grpc_server.port, backend.model_name
    grpc_server.stop()
    http.stop()
    backend.close()


def complete(url: str, model: str, **body: Any) -> httpx.Response:
    payload = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
               **body}  # fmt: skip
    return httpx.post(f"{url}/v1/completions", json=payload, timeout=60)


def text(response: httpx.Response) -> str:
    return response.json()["choices"][0]["text"]


def want(model_dir: Path, folder: str | None) -> list[int]:
    if folder is None:
        return oracle.hf_greedy(str(model_dir), tuple(PROMPT), MAX_TOKENS)
    return oracle.peft_greedy(str(model_dir), folder, tuple(PROMPT), MAX_TOKENS)


def want_text(model_dir: Path, folder: str | None) -> str:
    return Tokenizer.from_dir(model_dir).decode(want(model_dir, folder))


def test_model_picks_the_adapter_on_both_doors(doors, model_dir, folders) -> None:
    url, grpc_port, base = doors
    r = complete(url, "a")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "a"
    assert want(model_dir, folders["a"]) != want(model_dir, None)
    assert text(r) == want_text(model_dir, folders["a"])
    assert text(complete(url, base)) == want_text(model_dir, None)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = generate_pb2_grpc.GenerateServiceStub(channel)
        sampling = generate_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
        msg = generate_pb2.GenerateRequest(
            token_ids=generate_pb2.TokenIds(ids=PROMPT), sampling=sampling, model="a"
        )
        reply = stub.GenerateUnary(msg, timeout=60)
        assert list(reply.token_ids) == want(model_dir, folders["a"])
        with pytest.raises(grpc.RpcError) as e:
            stub.GenerateUnary(generate_pb2.GenerateRequest(
                token_ids=generate_pb2.TokenIds(ids=PROMPT), sampling=sampling, model="zz"
            ), timeout=60)  # fmt: skip
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "model" in e.value.details()


def test_load_list_use_and_unload_at_run_time(doors, model_dir, folders) -> None:
    url, _, base = doors
    assert complete(url, "b").status_code == 404
    r = httpx.post(f"{url}/v1/load_lora_adapter",
                   json={"lora_name": "b", "lora_path": folders["b"]}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    cards = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [(base, None), ("a", base), ("b", base)]
    assert text(complete(url, "b")) == want_text(model_dir, folders["b"])
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "b"}, timeout=30)
    assert r.status_code == 200, r.text
    r = complete(url, "b")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_bad_loads_are_refused_naming_the_field(doors, folders, tmp_path: Path) -> None:
    url, _, base = doors
    load = f"{url}/v1/load_lora_adapter"
    r = httpx.post(load, json={"lora_name": "c", "lora_path": str(tmp_path)}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
    r = httpx.post(load, json={"lora_name": base, "lora_path": folders["b"]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
    r = httpx.post(load, json={"lora_name": "a", "lora_path": folders["b"]}, timeout=30)
    assert r.status_code == 400 and "unload it first" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "nope"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"


def test_the_admin_api_loads_and_unloads_under_its_token(doors, folders) -> None:
    url, _, _ = doors
    api = f"{url}/admin/api/adapters"
    assert httpx.get(api, timeout=30).status_code == 401
    auth = {"Authorization": "Bearer adm"}
    r = httpx.post(api, json={"name": "c", "path": folders["b"]}, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    assert [a["name"] for a in r.json()["adapters"]] == ["a", "c"]
    r = httpx.delete(f"{api}/c", headers=auth, timeout=30)
    assert [a["name"] for a in r.json()["adapters"]] == ["a"]
    assert httpx.delete(f"{api}/c", headers=auth, timeout=30).status_code == 404
