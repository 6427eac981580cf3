"""Launch choices timed on one kind of device, read by the attention kernels' `launch_config`
(prefill) and `decode_launch` (decode).

A device's table is a JSON file here in tuned/, named after the device as torch names it
(lowercase, every run of other characters one '_': "NVIDIA H200" -> nvidia_h200.json). The
device check writes one after timing every candidate launch against SDPA (bench/device/
check.py, its kernels section), and uses it in-process for the sections after (`use`):

    {"device": "NVIDIA H200", "measured": "<date>, <command>, <its JSON>",
     "prefill": {"bfloat16/128": {"block_n": 16, "num_warps": 4, "num_stages": 3,
                                  "whole_pages": true, "block_m": 64}, ...},
     "decode": {"bfloat16/128": {"block_n": 32, "num_warps": 4, "num_stages": 3}, ...}}

A table in the folder BATON_KERNEL_TUNING names (the device check's own, for the servers it
starts; an operator's, tuned on their devices) comes before the one here. A device without
a table, or a (dtype, head_dim) its table lacks, gets the kernel's own default.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import torch

from core import env

HOME = Path(__file__).with_name("tuned")
FOLDER_ENV = env.KERNEL_TUNING.name
_in_process: dict[str, dict[str, Any]] = {}


def file_name(device_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_") + ".json"


def key(dtype: torch.dtype, head_dim: int) -> str:
    return f"{str(dtype).removeprefix('torch.')}/{head_dim}"


@functools.cache
def device_name(device_type: str, index: int | None) -> str | None:
    if device_type != "cuda":
        return None
    return torch.cuda.get_device_name(index)


@functools.cache
def _from_files(name: str) -> dict[str, Any]:
    folder_env = env.KERNEL_TUNING.get()
    folders = [Path(folder_env)] if folder_env else []
    for folder in [*folders, HOME]:
        path = folder / file_name(name)
        if path.exists():
            return json.loads(path.read_text())
    return {}


def table(name: str) -> dict[str, Any]:
    """The device's table: set in this process, else BATON_KERNEL_TUNING's, else the one
    here, else empty (the files are read once a process)."""
    return _in_process.get(name) or _from_files(name)


def use(name: str, tuned: dict[str, Any]) -> None:
    """Launch with `tuned` on devices called `name` from now on, in this process."""
    _in_process[name] = tuned


def prefill_entry(
    device: torch.device | None, dtype: torch.dtype, head_dim: int
) -> dict[str, Any] | None:
    """The prefill kernel's tuned launch (LaunchConfig's fields) on `device`, or None."""
    return _entry("prefill", device, dtype, head_dim)


def decode_entry(
    device: torch.device | None, dtype: torch.dtype, head_dim: int
) -> dict[str, Any] | None:
    """The decode kernel's tuned launch (DecodeLaunch's fields) on `device`, or None."""
    return _entry("decode", device, dtype, head_dim)


def _entry(
    kernel: str, device: torch.device | None, dtype: torch.dtype, head_dim: int
) -> dict[str, Any] | None:
    if device is None:
        return None
    name = device_name(device.type, device.index)
    if name is None:
        return None
    return table(name).get(kernel, {}).get(key(dtype, head_dim))
