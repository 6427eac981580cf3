"""Every `BATON_*` environment variable Baton reads, in one registry: its type, its default
and why it exists. No other module reads a `BATON_*` name from `os.environ`
(tests/architecture/test_env_registry.py holds that), so this file is the whole list, and
docs/configuration.md prints it.

A switch is read when it is asked for, not at import: a test may set it with monkeypatch,
and a worker process sees what its own environment says. Switches that change numbers must
agree across the nodes of a cluster (deploy/helm/baton/values.yaml's `commonEnv`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class EnvFlag:
    """An on/off switch: on unless set to `0`."""

    name: str
    why: str

    default_doc: ClassVar[str] = "1 (on)"

    def get(self) -> bool:
        return os.environ.get(self.name, "1") != "0"


@dataclass(frozen=True)
class EnvText:
    """A text setting: None when unset or empty (the caller's default then applies)."""

    name: str
    why: str
    default_doc: str = "unset"

    def get(self) -> str | None:
        return os.environ.get(self.name) or None


EnvSwitch = EnvFlag | EnvText

# Engine kernels: each switch keeps a plain path, to bisect a mismatch or a slowdown.
ATTENTION = EnvText(
    "BATON_ATTENTION",
    "forces one attention backend (torch, triton, cpu) over the device's choice; triton on "
    "a CPU runs its kernels in Triton's interpreter (kernel tests)",
)
FUSED_KERNELS = EnvFlag(
    "BATON_FUSED_KERNELS",
    "the Triton norm and rotary kernels on CUDA, rotary inside the Triton attention's KV "
    "write; 0 keeps the plain-torch ops and a KV write of its own (to bisect a GPU mismatch)",
)
CPU_FUSED = EnvFlag(
    "BATON_CPU_FUSED",
    "the fused CPU elementwise kernels (engine/cpu_kernels/fused.cpp); 0 keeps the plain torch ops",
)
CPU_GEMM = EnvFlag(
    "BATON_CPU_GEMM",
    "Baton's CPU GEMM kernels for decode-sized batches (engine/layers/cpu_gemm.py); 0 keeps "
    "torch's linear everywhere",
)
BF16_FMA = EnvFlag(
    "BATON_BF16_FMA",
    "the bfloat16 GEMM on float32 FMAs, on a CPU without AMX whose FMAs outrun `vdpbf16ps`; "
    "0 keeps the other bfloat16 paths",
)
CPU_FORWARD = EnvFlag(
    "BATON_CPU_FORWARD",
    "the flat CPU forward (engine/cpu_forward.py: the layers as one sequence of kernel "
    "calls); 0 runs the modules",
)
SHARED_ATTENTION_DOT = EnvFlag(
    "BATON_SHARED_ATTENTION_DOT",
    "shared-prefix attention on AVX-512 BF16 dot tiles on a CPU without AMX where "
    "`vdpbf16ps` is fast; 0 keeps such a CPU on the gather and flash path",
)
KERNEL_TUNING = EnvText(
    "BATON_KERNEL_TUNING",
    "a folder of kernel launch tables tuned on your devices (engine/kernels/tuned.py; the "
    "device check writes one), read before the tables Baton ships",
)

# Serving: secrets and addresses a deployment passes outside the command line.
ADMIN_TOKEN = EnvText(
    "BATON_ADMIN_TOKEN",
    "`baton serve --admin-token` when the flag is not given: a secret from the environment "
    "(a Kubernetes Secret), not the command line",
)
API_KEY = EnvText(
    "BATON_API_KEY",
    "`baton serve --api-key` when the flag is not given (a Kubernetes Secret)",
)
REDIS_URL = EnvText(
    "BATON_REDIS_URL",
    "`baton serve --redis` when the flag is not given (a URL holding a password is a secret)",
)
NODE_IP = EnvText(
    "BATON_NODE_IP",
    "the address this host's Ray node registered with, where `baton serve --address` cannot "
    "tell (several addresses, hosts sharing a filesystem); unset: Ray picks",
)

# Tools beside the server.
TRAINED_CACHE = EnvText(
    "BATON_TRAINED_CACHE",
    "where trained tiny models are kept between runs (engine/tiny_model/train.py)",
    default_doc="~/.cache/baton/trained",
)
TRACES = EnvText(
    "BATON_TRACES",
    "the folder of public request traces the benchmarks replay",
    default_doc="shared/traces beside the checkout",
)

SWITCHES: tuple[EnvSwitch, ...] = (
    ATTENTION,
    FUSED_KERNELS,
    CPU_FUSED,
    CPU_GEMM,
    BF16_FMA,
    CPU_FORWARD,
    SHARED_ATTENTION_DOT,
    KERNEL_TUNING,
    ADMIN_TOKEN,
    API_KEY,
    REDIS_URL,
    NODE_IP,
    TRAINED_CACHE,
    TRACES,
)
"""Every switch, in the order docs/configuration.md lists them."""
