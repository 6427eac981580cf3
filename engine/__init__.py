"""The model runtime both worker kinds share: checkpoint loading, Llama-family models, the
paged KV cache with prefix caching, the continuous-batching scheduler and the sampler.

Knows nothing of Ray, networks or HTTP: `LLM` runs it offline in one process.
"""

from core.request import RequestOutput
from core.sampling import SamplingParams

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from engine.engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)
