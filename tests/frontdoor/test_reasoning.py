"""`<think>` reasoning split from content (`--reasoning-parser`), streamed and whole: the two
readings agree however the text is cut into deltas, and tags never show."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from router.frontdoor.http.app import create_app
from router.frontdoor.reasoning import ReasoningReader
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

CASES = [
    ("deepseek_r1", "Let me see.</think>\n\nIt is 4.", ("Let me see.", "It is 4.")),
    ("deepseek_r1", "Still thinking", ("Still thinking", "")),
    ("qwen3", "\n<think>Hmm.</think>It is 4.", ("Hmm.", "It is 4.")),
    ("qwen3", "It is 4. <think>", (None, "It is 4. <think>")),
    ("qwen3", "<think>cut off", ("cut off", "")),
]


@pytest.mark.parametrize(("parser", "text", "expected"), CASES)
@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_streamed_equals_whole(parser: str, text: str, expected: tuple, step: int) -> None:
    assert ReasoningReader(parser).split(text) == expected
    reader = ReasoningReader(parser)
    parts = [reader.feed(text[i : i + step]) for i in range(0, len(text), step)]
    parts.append(reader.finish())
    assert "".join(r for r, _ in parts) == (expected[0] or "")
    assert "".join(c for _, c in parts) == expected[1]


@pytest.fixture(scope="module")
def thinking_server(backend: LocalBackend) -> Iterator[HTTPServerThread]:
    s = HTTPServerThread(create_app(backend, None, admin_token="t", reasoning_parser="deepseek_r1"))
    yield s.start()
    s.stop()


def test_reasoning_content_over_http(
    thinking_server: HTTPServerThread, server: HTTPServerThread
) -> None:
    """The tiny model never writes `</think>`: under deepseek_r1 its whole reply is
    reasoning, the text a server without the parser gives as content."""
    args = {"model": "tiny-llama", "messages": [{"role": "user", "content": "2+2?"}],
            "max_tokens": 10, "seed": 4}  # fmt: skip
    plain = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test-api-key", max_retries=0)
    thinking = openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key="x", max_retries=0)
    expected = plain.chat.completions.create(**args).choices[0].message.content
    message = thinking.chat.completions.create(**args).choices[0].message
    assert message.reasoning_content == expected  # type: ignore[attr-defined]
    assert not message.content
    streamed = ""
    for chunk in thinking.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            streamed += getattr(c.delta, "reasoning_content", None) or ""
            assert not c.delta.content
    assert streamed == expected
