"""`Backend` over one in-process engine: the front doors without a cluster (tests, a
laptop). Imports torch through the engine, so only import it where that is wanted."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from core.config import EngineConfig
from core.request import OutputDelta
from router.frontdoor.backend import GenerateRequest


class LocalBackend:
    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None) -> None:
        from engine.async_engine import AsyncEngine
        from engine.engine import LLMEngine

        self.engine = AsyncEngine(lambda: LLMEngine(model_dir, config))
        engine = self.engine.engine
        self.tokenizer = engine.tokenizer
        self.model_name = Path(model_dir).name
        self.max_model_len = engine.max_model_len

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        self.engine.open_stream(request.request_id)
        try:
            await self.engine.call(
                lambda e: e.add_request(
                    request.request_id,
                    request.prompt_token_ids,
                    request.params,
                    priority=request.priority,
                    tenant=request.tenant,
                    lora=request.lora,
                )
            )
        except BaseException:  # a bad prompt, or cancelled (the client hung up) meanwhile
            self.engine.close_stream(request.request_id)
            # Cancelled while the engine thread adds it, the request is added anyway: abort it
            # after (commands run in order; for a refused prompt it is a no-op).
            self.engine.submit(lambda e: e.abort(request.request_id))
            raise
        stream = self.engine.stream(request.request_id, request.timeout_s)
        async with contextlib.aclosing(stream) as outputs:  # closing early aborts
            async for out in outputs:
                yield out

    def is_ready(self) -> bool:
        return True

    def close(self) -> None:
        self.engine.stop()
