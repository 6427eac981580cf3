"""Request fields OpenAI publishes that Baton does not honour: each is refused with a 400
naming it, unless its value asks for nothing (`store: false`, `modalities: ["text"]`).

Together with `extra="forbid"` on the request models this makes both endpoints an allow-list:
a field is honoured, refused here, or unknown (400 "Unrecognized request argument", as
OpenAI answers). vLLM instead accepts unknown fields and only logs them; we follow OpenAI,
because a silently dropped field is a wrong answer the client cannot see (a misspelt
`max_tokens` would run to the context's end).

Accepted without effect on the output, as OpenAI defines them: `user`, `safety_identifier`
(abuse-monitoring labels) and `prompt_cache_key` (a cache-routing hint; Baton's router finds
cached prefixes by content).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from router.frontdoor.http.errors import APIError


@dataclass(frozen=True)
class Refusal:
    field: str
    why: str
    neutral: tuple[object, ...] = (None,)
    """Values that ask for nothing, so honouring them is doing nothing."""


_SHARED = (
    Refusal("guided_decoding_backend", "only 'xgrammar' (or 'auto') is served",
            (None, "xgrammar", "auto")),
)  # fmt: skip

CHAT = (
    *_SHARED,
    Refusal("audio", "audio output is not supported"),
    Refusal("modalities", "only text output is supported", (None, ["text"])),
    Refusal("prediction", "predicted outputs are not supported"),
    Refusal("reasoning_effort", "not supported; a model's thinking is switched in its template"),
    Refusal("verbosity", "not supported"),
    Refusal("web_search_options", "web search is not supported"),
    Refusal("functions", "deprecated and not supported; use tools"),
    Refusal("function_call", "deprecated and not supported; use tool_choice"),
    Refusal("store", "Baton stores no completions", (None, False)),
    Refusal("metadata", "Baton stores no completions to attach metadata to"),
    Refusal("service_tier", "only the default tier is served", (None, "auto", "default")),
)

COMPLETIONS = (
    *_SHARED,
    Refusal("best_of", "not supported (use n)", (None, 1)),
    Refusal("suffix", "fill-in-the-middle is not supported", (None, "")),
)


def refuse_unsupported(body: BaseModel, refusals: tuple[Refusal, ...]) -> None:
    """APIError 400 (param = the field) for the first refused field set to a value that
    asks for something; and for `stream_options` without `stream` (as OpenAI and vLLM
    answer: they would have nothing to apply to)."""
    if getattr(body, "stream_options", None) is not None and not getattr(body, "stream", False):
        raise APIError(400, "stream_options: only allowed with stream=true", "invalid_value",
                       "stream_options")  # fmt: skip
    for r in refusals:
        value = getattr(body, r.field)
        if value not in r.neutral:
            raise APIError(400, f"{r.field}: {r.why}", "unsupported_parameter", r.field)
