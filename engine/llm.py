"""The offline API: `LLM(model).generate(prompts, params)`, `model` a Hugging Face checkpoint
folder or a GGUF file (engine/gguf)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from core.config import EngineConfig
from core.lora import LoRARef
from core.request import RequestOutput
from core.sampling import SamplingParams
from engine.completion import run_to_completion
from engine.engine import LLMEngine

Prompt = str | list[int]


class LLM:
    """Runs a local Hugging Face checkpoint folder in this process.

    Keyword arguments are `core.config.EngineConfig` fields (block_size, num_kv_blocks,
    max_num_seqs, max_num_batched_tokens, enable_prefix_caching, dtype, ...).
    """

    def __init__(self, model: str | Path, **engine_kwargs: Any) -> None:
        self.engine = LLMEngine(model, EngineConfig(**engine_kwargs))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora: LoRARef | Sequence[LoRARef | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, or a list of token ids); outputs in input order.
        `lora`: the LoRA adapter (`core.lora.lora_ref`) of every prompt, or one per prompt
        (None: the base model); the engine needs `max_loras` slots.

        Invalid input raises ValueError before anything is queued.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompt_list = list(prompts)  # type: ignore[arg-type]
        if params is None or isinstance(params, SamplingParams):
            param_list = [params or SamplingParams()] * len(prompt_list)
        else:
            param_list = list(params)
            if len(param_list) != len(prompt_list):
                raise ValueError(
                    f"{len(param_list)} sampling params for {len(prompt_list)} prompts"
                )
        loras = list(lora) if isinstance(lora, Sequence) else [lora] * len(prompt_list)
        if len(loras) != len(prompt_list):
            raise ValueError(f"{len(loras)} LoRA adapters for {len(prompt_list)} prompts")
        requests = [
            replace(self.engine.prepare(f"llm-{next(self._ids)}", p, sp), lora=ref)
            for p, sp, ref in zip(prompt_list, param_list, loras, strict=True)
        ]
        for request in requests:
            self.engine.enqueue(request)
        outputs = run_to_completion(
            self.engine, {r.request_id: r.prompt_token_ids for r in requests}
        )
        return [outputs[r.request_id] for r in requests]

    def chat(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams | None = None,
    ) -> RequestOutput:
        return self.generate([self.tokenizer.encode_chat(messages)], params)[0]
