"""The front-door group: where the HTTP and gRPC APIs listen, who may call them, and how
replies are read (tool calls, reasoning)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from core import env
from router.cli.config.knob import knob


@dataclass(frozen=True)
class FrontDoorOptions:
    TITLE: ClassVar[str] = "front door"
    ABOUT: ClassVar[str] = "the OpenAI HTTP API, the gRPC API, and the admin API / dashboard"

    host: str = knob(
        "127.0.0.1", "front-door bind address (0.0.0.0: every interface)", metavar="ADDRESS"
    )
    port: int = knob(
        8000, "HTTP port (OpenAI API, metrics, admin API and dashboard)", metavar="PORT"
    )
    grpc_port: int = knob(50051, "gRPC port", metavar="PORT")
    api_key: str | None = knob(
        None,
        "require this bearer token on the API",
        env=env.API_KEY,
        default_doc="unset (no key asked)",
        metavar="KEY",
    )
    allowed_origins: str = knob(
        "",
        "comma-separated browser origins allowed to call the API (CORS), e.g. "
        "https://app.example.com",
        default_doc="none",
        metavar="ORIGINS",
    )
    admin_token: str | None = knob(
        None,
        "admin API / dashboard token",
        env=env.ADMIN_TOKEN,
        default_doc="generated and printed",
        metavar="TOKEN",
    )
    request_timeout: float = knob(
        300.0, "seconds before a request is failed with a deadline error", minimum=0, metavar="S"
    )
    tool_call_parser: str | None = knob(
        None,
        "how function calls are read from the model's text (tool_choice auto): hermes (Hermes, "
        "Qwen), llama3_json (Llama 3.1+), mistral",
        choices=("hermes", "llama3_json", "mistral"),
        default_doc="by the checkpoint's model_type (llama: llama3_json, mistral/mixtral: "
        "mistral, else hermes)",
    )
    reasoning_parser: str | None = knob(
        None,
        "split `<think>...</think>` into reasoning_content: deepseek_r1 (the template opens the "
        "block) or qwen3 (the reply does)",
        choices=("deepseek_r1", "qwen3"),
        default_doc="off",
    )
