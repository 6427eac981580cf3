"""Where a computation reads a tensor's values on the host: on CUDA, each such place makes the
host wait for everything queued on the device (what an overlapped step must not do,
engine/overlap.py). torch's sync debug mode (`torch.cuda.set_sync_debug_mode`) names these
places only on a GPU; `HostReads` finds the same ops on the CPU, by what they are: a scalar
read (`item`, `bool`, `int`), an op whose output's size depends on the values (`nonzero`, a
boolean mask's index, `masked_select`, `unique`, `repeat_interleave` without its size), or a
tensor's values copied out (`tolist`, `numpy`).

    with HostReads() as reads:
        sampler.sample(logits, rows)
    assert reads.places == []
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_READS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
    aten.equal.default,
}
_MASK_INDEXED = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default}


def _is_read(func: Any, args: tuple) -> bool:
    if func in _READS:
        return func is not aten.repeat_interleave.Tensor or len(args) < 2 or args[-1] is None
    if func in _MASK_INDEXED:
        indices = args[1] if len(args) > 1 else ()
        return any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
        )
    return False


def _caller() -> str:
    """The innermost frame outside torch and this module: the line that asked for the read."""
    for frame in reversed(traceback.extract_stack()):
        if "/torch/" not in frame.filename and not frame.filename.endswith("host_reads.py"):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


class HostReads(TorchDispatchMode):
    """Records each host read of a tensor's values (see the module) while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.places: list[str] = []
        self._methods: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_read(func, args):
            self.places.append(f"{func} at {_caller()}")
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostReads:
        for name in ("tolist", "numpy"):  # not dispatched on the CPU: watched at the method
            original = self._methods[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._watched(name, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name, original in self._methods.items():
            setattr(torch.Tensor, name, original)

    def _watched(self, name: str, original: Any) -> Any:
        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.places.append(f"Tensor.{name} at {_caller()}")
            return original(tensor, *args, **kwargs)

        return read
