"""The LoRA adapters a front door serves beside its base model, by name.

`model` in a request picks one (the base model's name picks none). Adapters come from
`--lora-modules NAME=DIR ...` at start-up and from the load / unload endpoints at run time
(vLLM's `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, and the admin API). A request
carries its adapter's `LoRARef` to every worker it touches (prefill and decode), and each
worker loads the folder itself: the folder must be readable where the workers run (a shared
volume, as for the model).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from core.errors import InvalidRequestError
from core.lora import LoRARef, lora_ref

MAX_ADAPTERS = 1024
"""Names one front door keeps (each a few hundred bytes; a bound on a client's loads)."""


class UnknownAdapterError(KeyError):
    pass


class AdapterRegistry:
    def __init__(self, base_model: str, modules: Iterable[tuple[str, str]] = ()) -> None:
        self.base_model = base_model
        self._adapters: dict[str, LoRARef] = {}
        self._lock = threading.Lock()
        for name, path in modules:
            self.load(name, path)

    def load(self, name: str, path: str) -> LoRARef:
        """Serve the PEFT folder `path` as `name` (again from the same folder: its weights
        digested anew, so changed weights never reuse the old ones' cached KV). Raises
        InvalidRequestError naming the field at fault."""
        if name == self.base_model:
            raise InvalidRequestError(f"lora_name: {name!r} is the base model's name")
        ref = lora_ref(name, path)
        with self._lock:
            held = self._adapters.get(name)
            if held is not None and held.path != ref.path:
                raise InvalidRequestError(
                    f"lora_name: {name!r} already serves {held.path}; unload it first"
                )
            if held is None and len(self._adapters) >= MAX_ADAPTERS:
                raise InvalidRequestError(f"lora_name: {MAX_ADAPTERS} adapters are loaded")
            self._adapters[name] = ref
        return ref

    def unload(self, name: str) -> LoRARef:
        with self._lock:
            ref = self._adapters.pop(name, None)
        if ref is None:
            raise UnknownAdapterError(name)
        return ref

    def resolve(self, model: str) -> LoRARef | None:
        """The adapter `model` names, None for the base model; UnknownAdapterError else."""
        if model == self.base_model:
            return None
        ref = self._adapters.get(model)
        if ref is None:
            raise UnknownAdapterError(model)
        return ref

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._adapters)

    def get(self, name: str) -> LoRARef | None:
        return self._adapters.get(name)
