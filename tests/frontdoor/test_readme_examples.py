"""The README's front-door examples, run exactly as written (only the ports differ: the
README uses the defaults 8000 / 50051, the tests free ports)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from router.frontdoor.http.app import create_app
from tests.frontdoor.conftest import ADMIN_TOKEN
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.in_process_admin import InProcessAdmin
from tests.support.local_backend import LocalBackend

CURL_CHAT = """\
curl -s http://127.0.0.1:8000/v1/chat/completions \\
  -H "Content-Type: application/json" \\
  -d '{"model": "tiny-llama", "max_tokens": 32,
       "messages": [{"role": "user", "content": "Tell me about batons."}]}'
"""
CURL_STREAM = """\
curl -sN http://127.0.0.1:8000/v1/completions \\
  -H "Content-Type: application/json" \\
  -d '{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 16, "stream": true}'
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
    model="tiny-llama",
    messages=[{"role": "user", "content": "Tell me about batons."}],
    max_tokens=32,
)
print(reply.choices[0].message.content)
print(reply.usage)

stream = client.completions.create(
    model="tiny-llama", prompt="Once upon a time", max_tokens=32, stream=True
)
for chunk in stream:
    print(chunk.choices[0].text, end="", flush=True)
"""
GRPC_EXAMPLE = """\
from router.frontdoor.grpc.client import BatonClient

with BatonClient("127.0.0.1:50051") as client:
    for chunk in client.generate("Tell me about batons.", max_tokens=32):
        print(chunk.text, end="", flush=True)
    reply = client.complete([{"role": "user", "content": "Hi!"}], max_tokens=16, temperature=0)
    print(reply.text, reply.usage.completion_tokens)
"""


@pytest.fixture(scope="module")
def open_servers(
    backend: LocalBackend, admin: InProcessAdmin
) -> Iterator[tuple[HTTPServerThread, GRPCServerThread]]:
    """The servers as `baton serve` starts them: no API key, an admin token."""
    assert backend.model_name == "tiny-llama"
    http = HTTPServerThread(create_app(backend, admin, admin_token=ADMIN_TOKEN)).start()
    grpc = GRPCServerThread(backend, admin, admin_token=ADMIN_TOKEN).start()
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
