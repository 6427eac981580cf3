"""Nothing a client sends is silently dropped: every field of OpenAI's published chat and
completions request schemas (and the vLLM extras Baton serves), each with a realistic value,
is either honoured (200) or refused with a 400 whose `param` names it; an unknown field is a
400 too. Then the cheap fields that are honoured, checked for their effect: logit_bias,
min_tokens, include_stop_str_in_output."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.frontdoor.conftest import API_KEY
from tests.support.http_server import HTTPServerThread

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Tell me about batons."}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
OK, REFUSED = 200, 400

# OpenAI's CreateChatCompletionRequest, every field, with the status Baton answers.
CHAT_FIELDS: list[tuple[str, Any, int]] = [
    ("audio", {"voice": "alloy", "format": "wav"}, REFUSED),
    ("frequency_penalty", 0.5, OK),
    ("function_call", "auto", REFUSED),
    ("functions", [TOOL["function"]], REFUSED),
    ("logit_bias", {"50": 5.0}, OK),
    ("logprobs", True, OK),
    ("max_completion_tokens", 8, OK),
    ("max_tokens", 8, OK),
    ("metadata", {"team": "relay"}, REFUSED),
    ("modalities", ["text"], OK),
    ("modalities", ["text", "audio"], REFUSED),
    ("n", 2, OK),
    ("parallel_tool_calls", False, OK),
    ("prediction", {"type": "content", "content": "Batons are"}, REFUSED),
    ("presence_penalty", 0.5, OK),
    ("prompt_cache_key", "user-42-session", OK),
    ("reasoning_effort", "low", REFUSED),
    ("response_format", {"type": "json_object"}, OK),
    ("safety_identifier", "hashed-user-42", OK),
    ("seed", 42, OK),
    ("service_tier", "auto", OK),
    ("service_tier", "flex", REFUSED),
    ("stop", ["\n\n"], OK),
    ("store", False, OK),
    ("store", True, REFUSED),
    ("stream", False, OK),
    ("stream_options", {"include_usage": True}, REFUSED),  # without stream=true
    ("temperature", 0.7, OK),
    ("tool_choice", "none", OK),
    ("tool_choice", "required", REFUSED),  # without tools
    ("tools", [TOOL], OK),
    ("top_logprobs", 2, REFUSED),  # without logprobs=true
    ("top_p", 0.9, OK),
    ("user", "user-42", OK),
    ("verbosity", "low", REFUSED),
    ("web_search_options", {"search_context_size": "low"}, REFUSED),
]

# OpenAI's CreateCompletionRequest, every field.
COMPLETION_FIELDS: list[tuple[str, Any, int]] = [
    ("best_of", 3, REFUSED),
    ("best_of", 1, OK),
    ("echo", True, OK),
    ("frequency_penalty", 0.5, OK),
    ("logit_bias", {"50": -100.0}, OK),
    ("logprobs", 2, OK),
    ("max_tokens", 8, OK),
    ("n", 2, OK),
    ("presence_penalty", 0.5, OK),
    ("seed", 42, OK),
    ("stop", "\n", OK),
    ("stream", False, OK),
    ("stream_options", {"include_usage": True}, REFUSED),  # without stream=true
    ("suffix", " and that is all.", REFUSED),
    ("temperature", 0.7, OK),
    ("top_p", 0.9, OK),
    ("user", "user-42", OK),
]

# vLLM's sampling extras, on both endpoints.
VLLM_FIELDS: list[tuple[str, Any, int]] = [
    ("top_k", 20, OK),
    ("min_p", 0.05, OK),
    ("repetition_penalty", 1.1, OK),
    ("ignore_eos", True, OK),
    ("stop_token_ids", [2], OK),
    ("min_tokens", 4, OK),
    ("include_stop_str_in_output", True, OK),
    ("skip_special_tokens", False, OK),
    ("guided_decoding_backend", "xgrammar", OK),
    ("guided_decoding_backend", "outlines", REFUSED),
    ("use_beam_search", True, REFUSED),  # not served: unknown here
    ("logits_processors", ["my.module:Processor"], REFUSED),
    ("timeout", 30.0, OK),
    ("priority", -3, OK),
    ("priority", "urgent", REFUSED),
    ("priority", 2**40, REFUSED),
]


def post(server: HTTPServerThread, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=AUTH, json=body, timeout=60)


def check(r: httpx.Response, field: str, status: int) -> None:
    assert r.status_code == status, (field, r.text)
    if status == REFUSED:
        error = r.json()["error"]
        assert error["param"] == field, error
        assert field in error["message"], error
        assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("field", "value", "status"), CHAT_FIELDS + VLLM_FIELDS)
def test_every_chat_field_is_honoured_or_refused(
    server: HTTPServerThread, field: str, value: Any, status: int
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, field: value}
    check(post(server, "/v1/chat/completions", body), field, status)


@pytest.mark.parametrize(("field", "value", "status"), COMPLETION_FIELDS + VLLM_FIELDS)
def test_every_completions_field_is_honoured_or_refused(
    server: HTTPServerThread, field: str, value: Any, status: int
) -> None:
    body = {"model": MODEL, "prompt": "Batons are", "max_tokens": 8, field: value}
    check(post(server, "/v1/completions", body), field, status)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokenz": 8}, "max_tokenz"),
        ("/v1/chat/completions",
         {"messages": MESSAGES, "stream": True, "stream_options": {"x": 1}}, "stream_options.x"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "mood": "ok"}]},
         "messages.0.mood"),
        ("/v1/chat/completions",
         {"messages": MESSAGES, "response_format": {"type": "text", "strict": True}},
         "response_format.strict"),
    ],
)  # fmt: skip
def test_unknown_fields_are_400_naming_them(
    server: HTTPServerThread, path: str, body: dict[str, Any], param: str
) -> None:
    r = post(server, path, {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert error["message"] == f"Unrecognized request argument supplied: {param}"


def test_a_reply_from_openai_echoed_back_is_accepted(server: HTTPServerThread) -> None:
    echoed = {"role": "assistant", "content": "Hello.", "refusal": None, "audio": None,
              "function_call": None, "annotations": [], "tool_calls": []}  # fmt: skip
    body = {"model": MODEL, "messages": [*MESSAGES, echoed, MESSAGES[0]], "max_tokens": 4}
    assert post(server, "/v1/chat/completions", body).status_code == 200
    echoed["annotations"] = [{"type": "url_citation"}]
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.annotations"


@pytest.mark.parametrize(
    ("bias", "why"), [({"-1": 1.0}, "token id"), ({"x": 1.0}, "token id"),
                      ({"10": 101.0}, "[-100, 100]"), ({"99999999": 1.0}, "token id")]
)  # fmt: skip
def test_bad_logit_bias_is_400(server: HTTPServerThread, bias: dict, why: str) -> None:
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": bias})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "logit_bias"
    assert why in r.json()["error"]["message"]


def completion(server: HTTPServerThread, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": "Batons are", "temperature": 0, **fields}
    r = post(server, "/v1/completions", {**body, "logprobs": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]  # type: ignore[no-any-return]


def token_id(backend: Any, text: str) -> int:
    """The id of the token whose text (decoded alone, as logprobs show it) is `text`."""
    tok = backend.tokenizer
    return next(i for i in range(tok.vocab_size) if tok.decode([i], False) == text)


def test_logit_bias_forces_and_bans_tokens(server: HTTPServerThread, backend: Any) -> None:
    free = completion(server, max_tokens=6)
    first = token_id(backend, free["logprobs"]["tokens"][0])
    banned = completion(server, max_tokens=6, logit_bias={str(first): -100})
    assert banned["logprobs"]["tokens"][0] != free["logprobs"]["tokens"][0]
    forced = backend.tokenizer.encode(" relay", add_special_tokens=False)[0]
    out = completion(server, max_tokens=4, logit_bias={str(forced): 100})
    assert out["text"] == backend.tokenizer.decode([forced] * 4)


def test_min_tokens_holds_off_stop_tokens(server: HTTPServerThread, backend: Any) -> None:
    free = completion(server, max_tokens=6)
    first = token_id(backend, free["logprobs"]["tokens"][0])
    # The greedy first token as a stop token ends the request at once ...
    stopped = completion(server, max_tokens=6, stop_token_ids=[first])
    assert stopped["finish_reason"] == "stop" and stopped["text"] == ""
    # ... unless min_tokens holds it off: it is then banned, and the request runs on.
    held = completion(server, max_tokens=6, stop_token_ids=[first], min_tokens=6)
    assert held["finish_reason"] == "length"
    assert len(held["logprobs"]["tokens"]) == 6
    assert free["logprobs"]["tokens"][0] not in held["logprobs"]["tokens"]


def test_include_stop_str_in_output(server: HTTPServerThread) -> None:
    free = completion(server, max_tokens=8)["text"]
    stop = free[2:4]
    assert completion(server, max_tokens=8, stop=[stop])["text"] == free[: free.index(stop)]
    kept = completion(server, max_tokens=8, stop=[stop], include_stop_str_in_output=True)
    assert kept["text"] == free[: free.index(stop) + len(stop)]


def test_min_tokens_above_max_tokens_is_400(server: HTTPServerThread) -> None:
    r = post(server, "/v1/completions",
             {"model": MODEL, "prompt": "x", "max_tokens": 4, "min_tokens": 5})  # fmt: skip
    assert r.status_code == 400 and "min_tokens" in r.json()["error"]["message"]
