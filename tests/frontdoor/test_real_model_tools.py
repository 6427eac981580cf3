"""Function calling on a real model: SmolLM2-135M-Instruct (the default model), asked about
the weather with a weather tool it must call, calls it with the city the question names.
(With tool_choice "auto" this 135M model answers in prose instead: docs/performance.md.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

pytestmark = pytest.mark.slow
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def url(smollm2_dir: Path) -> Iterator[str]:
    backend = LocalBackend(smollm2_dir, EngineConfig(num_kv_blocks=128, num_threads=1))
    server = HTTPServerThread(create_app(backend, None)).start()
    yield f"http://127.0.0.1:{server.port}/v1/chat/completions"
    server.stop()
    backend.close()


@pytest.mark.parametrize("city", ["Paris", "Tokyo", "London"])
def test_a_required_tool_call_names_the_city(url: str, city: str) -> None:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": f"What is the weather like in {city} now?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 64,
        "temperature": 0,
    }
    choice = httpx.post(url, json=body, timeout=120).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": city}
