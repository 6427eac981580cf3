"""Fractional GPUs: `--gpus-per-worker 0.5` asks Ray for half a GPU a worker, so a prefill
and a decode worker share one device, each engine filling its part of the memory share.
What a worker actor is started with is read from the options `launch_worker` gives Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from core.config import EngineConfig
from router.cli.main import build_parser
from router.cli.serve import build_spec
from router.cluster import launch
from router.cluster.spec import ClusterSpec


class RecordingRemote:
    """Stands in for `ray.remote(cls)`: keeps the actor's options and arguments."""

    def __init__(self) -> None:
        self.options_seen: dict[str, Any] = {}
        self.args: tuple[Any, ...] = ()

    def options(self, **options: Any) -> RecordingRemote:
        self.options_seen = options
        return self

    def remote(self, *args: Any) -> object:
        self.args = args
        return object()


def launched(monkeypatch: pytest.MonkeyPatch, spec: ClusterSpec, pool: str) -> RecordingRemote:
    remote = RecordingRemote()
    monkeypatch.setattr(launch.ray, "remote", lambda cls: remote)
    asyncio.run(launch.launch_worker(spec, pool, f"{pool}-0", f"baton-{pool}-0"))
    return remote


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_each_worker_asks_for_its_part_of_a_gpu(monkeypatch, pool: str) -> None:
    spec = ClusterSpec(model_dir="/m", device="cuda", gpus_per_worker=0.5)
    remote = launched(monkeypatch, spec, pool)
    assert remote.options_seen["num_gpus"] == 0.5
    worker_spec = remote.args[0]
    assert worker_spec.engine.gpu_fraction == 0.5 and worker_spec.engine.device == "cuda"


def test_a_whole_gpu_by_default_and_none_on_cpu(monkeypatch) -> None:
    remote = launched(monkeypatch, ClusterSpec(model_dir="/m", device="cuda"), "decode")
    assert remote.options_seen["num_gpus"] == 1 and remote.args[0].engine.gpu_fraction == 1
    cpu = ClusterSpec(model_dir="/m", device="cpu", gpus_per_worker=0.5)
    remote = launched(monkeypatch, cpu, "decode")
    assert "num_gpus" not in remote.options_seen and remote.args[0].engine.gpu_fraction == 1


def test_the_flag_reaches_the_spec() -> None:
    args = build_parser().parse_args(["serve", "--device", "cpu", "--gpus-per-worker", "0.5"])
    assert build_spec(args, Path("/models/m")).gpus_per_worker == 0.5


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--gpus-per-worker", "0"], "--gpus-per-worker must be in"),
        (["--gpus-per-worker", "2"], "--gpus-per-worker must be in"),
        (["--gpus-per-worker", "0.5", "--tp", "2"], "needs TP 1"),
        (["--gpus-per-worker", "0.5", "--decode-layout", "tp=2"], "needs TP 1"),
    ],
)
def test_bad_shares_name_the_flag(flags: list[str], message: str) -> None:
    args = build_parser().parse_args(["serve", "--device", "cpu", *flags])
    with pytest.raises(SystemExit, match=message):
        build_spec(args, Path("/models/m"))


def test_the_spec_refuses_a_shared_gpu_for_tp_ranks() -> None:
    with pytest.raises(ValueError, match="whole GPUs"):
        ClusterSpec(model_dir="/m", gpus_per_worker=0.5, decode_tp=2)
    with pytest.raises(ValueError, match="gpus_per_worker"):
        ClusterSpec(model_dir="/m", gpus_per_worker=0)
    assert EngineConfig().gpu_fraction == 1
