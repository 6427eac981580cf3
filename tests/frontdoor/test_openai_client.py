"""The official `openai` package against the HTTP front door, with a real tiny engine."""

from __future__ import annotations

import asyncio

import openai
import pytest

from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest
from tests.frontdoor.conftest import API_KEY
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

CHAT = [{"role": "user", "content": "Tell me about batons."}]


@pytest.fixture()
def client(server: HTTPServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=30, max_retries=0)


def engine_text(backend: LocalBackend, prompt_ids: list[int], params: SamplingParams) -> str:
    """The same request straight through the backend, on a loop of our own."""

    async def run() -> str:
        text = ""
        async for out in backend.generate(GenerateRequest("direct", prompt_ids, params)):
            text += out.new_text
        return text

    return asyncio.run(run())


def test_models_lists_the_served_model(client: openai.OpenAI, backend: LocalBackend) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [backend.model_name]


def test_completion_usage_and_engine_parity(client: openai.OpenAI, backend: LocalBackend) -> None:
    prompt = "The relay team passed the baton"
    r = client.completions.create(
        model=backend.model_name,
        prompt=prompt,
        max_tokens=12,
        temperature=0.8,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    ids = backend.tokenizer.encode(prompt)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(ids) + 12
    assert r.choices[0].finish_reason == "length"
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=7, ignore_eos=True)
    assert r.choices[0].text == engine_text(backend, ids, params)


def test_chat_non_streaming_and_streaming_agree(
    client: openai.OpenAI, backend: LocalBackend
) -> None:
    args = dict(model=backend.model_name, messages=CHAT, max_tokens=10, temperature=0.0)
    whole = client.chat.completions.create(**args)
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    # The chat template renders BOS itself: the prompt is the template's exact tokens.
    text = backend.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    ids = backend.tokenizer.encode(text, add_special_tokens=False)
    assert whole.usage.prompt_tokens == len(ids)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    assert whole.choices[0].message.content == engine_text(backend, ids, params)


def test_completion_stream_ends_with_done_and_concatenates(
    server: HTTPServerThread, client: openai.OpenAI, backend: LocalBackend
) -> None:
    args = dict(model=backend.model_name, prompt="hello there", max_tokens=8, temperature=0.0)
    whole = client.completions.create(**args)
    pieces = list(client.completions.create(**args, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text
    import httpx

    raw = httpx.post(
        f"{server.url}/v1/completions",
        json={**args, "stream": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=30,
    ).text
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_stop_string_is_honoured(client: openai.OpenAI, backend: LocalBackend) -> None:
    args = dict(
        model=backend.model_name,
        prompt="once upon",
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    free = client.completions.create(**args, max_tokens=24).choices[0].text
    assert len(free) > 4
    stop = free[3:5]  # a string the model is known to produce
    r = client.completions.create(**args, max_tokens=24, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert free.startswith(r.choices[0].text)


def test_n_choices_seeded_and_logprobs(client: openai.OpenAI, backend: LocalBackend) -> None:
    r = client.chat.completions.create(
        model=backend.model_name,
        messages=CHAT,
        max_completion_tokens=6,
        temperature=1.0,
        seed=3,
        n=3,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    for c in r.choices:
        for item in c.logprobs.content:
            assert item.logprob <= 0.0 and len(item.top_logprobs) == 2
    again = client.chat.completions.create(
        model=backend.model_name,
        messages=CHAT,
        max_completion_tokens=6,
        temperature=1.0,
        seed=3,
        n=3,
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    legacy = client.completions.create(
        model=backend.model_name, prompt="abc", max_tokens=4, logprobs=3, temperature=0.0
    )
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs)  # texts of ids may collide


def test_cached_prompt_tokens_are_reported(client: openai.OpenAI, backend: LocalBackend) -> None:
    prompt = "a long shared prefix about relay races and batons, " * 4
    args = dict(model=backend.model_name, prompt=prompt, max_tokens=2, temperature=0.0)
    client.completions.create(**args)
    second = client.completions.create(**args)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached < second.usage.prompt_tokens


def test_async_client_streams(server: HTTPServerThread, backend: LocalBackend) -> None:
    async def run() -> str:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        stream = await aclient.chat.completions.create(
            model=backend.model_name, messages=CHAT, max_tokens=5, stream=True, temperature=0
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        await aclient.close()
        return text

    assert isinstance(asyncio.run(run()), str)
