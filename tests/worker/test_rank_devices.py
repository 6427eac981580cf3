"""Which GPU a tensor-parallel rank on Ray runs on: every rank sees all the node's GPUs (so
NCCL can use P2P / NVLink between them) and picks the one Ray assigned it. No Ray cluster:
the mapping is a pure function, and the actor's use of it runs with Ray's calls replaced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from engine.tp.ranks import RankStart, visible_device_index
from worker import ray_ranks


def test_without_a_visible_list_the_gpu_id_is_the_device_index() -> None:
    assert visible_device_index([3], None) == 3
    assert visible_device_index(["0"], None) == 0


def test_the_index_is_the_position_in_the_visible_list() -> None:
    assert [visible_device_index([gpu], "2,3,5") for gpu in ("2", "3", "5")] == [0, 1, 2]
    assert visible_device_index([5], " 2, 3 ,5") == 2  # ints from Ray, spaces in the list


def test_a_list_narrowed_to_the_one_gpu_gives_device_0() -> None:
    # What Ray sets when the no-set flag is not honoured: still the right device.
    assert visible_device_index(["5"], "5") == 0


def test_gpus_named_by_uuid() -> None:
    visible = "GPU-aaaa,GPU-bbbb"
    assert visible_device_index(["GPU-bbbb"], visible) == 1
    with pytest.raises(RuntimeError, match="not a device number"):
        visible_device_index(["GPU-bbbb"], None)


def test_a_gpu_that_is_not_visible_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"GPU 4 assigned to this rank is not visible.*2,3,5"):
        visible_device_index(["4"], "2,3,5")
    with pytest.raises(RuntimeError, match="not visible"):
        visible_device_index([0], "")


@pytest.mark.parametrize("assigned", [[], [0, 1]])
def test_a_rank_needs_exactly_one_gpu(assigned: list[int]) -> None:
    with pytest.raises(RuntimeError, match="exactly one GPU"):
        visible_device_index(assigned, None)


class _RecordingActorClass:
    """Stands in for `ray.remote(RankActor)`: records the options each rank starts with."""

    def __init__(self) -> None:
        self.options_seen: list[dict[str, Any]] = []

    def options(self, **options: Any) -> _RecordingActorClass:
        self.options_seen.append(options)
        return self

    def remote(self) -> Any:
        return SimpleNamespace(start=SimpleNamespace(remote=lambda start: None))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_only_gpu_ranks_keep_the_node_gpus_visible(monkeypatch, device: str) -> None:
    actor_class = _RecordingActorClass()
    monkeypatch.setattr(ray_ranks.ray, "remote", lambda cls: actor_class)
    monkeypatch.setattr(ray_ranks.ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    ray_ranks.start_ray_ranks(2, device, factory=lambda tp: None)
    env = [o.get("runtime_env", {}).get("env_vars", {}) for o in actor_class.options_seen]
    flag = env[0].get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")
    if device == "cuda":
        assert flag == "1" and env[1] == env[0]
        assert [o["num_gpus"] for o in actor_class.options_seen] == [1, 1]
    else:
        assert flag is None


@pytest.mark.parametrize("backend,want", [("nccl", 2), ("gloo", None)])
def test_a_rank_builds_on_the_device_ray_assigned(monkeypatch, backend: str, want) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    monkeypatch.setattr(ray_ranks.ray, "get_gpu_ids", lambda: ["5"])
    built: list[int | None] = []
    monkeypatch.setattr(ray_ranks, "build_rank", lambda start, index: built.append(index))
    start = RankStart(0, 2, "tcp://127.0.0.1:1", backend, 1.0, lambda tp: None)
    assert ray_ranks.RankActor().start(start) == ("ok", None)
    assert built == [want]


def test_a_rank_given_no_visible_gpu_reports_why(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(ray_ranks.ray, "get_gpu_ids", lambda: ["7"])
    start = RankStart(1, 2, "tcp://127.0.0.1:1", "nccl", 1.0, lambda tp: None)
    kind, error = ray_ranks.RankActor().start(start)
    assert kind == "error" and "GPU 7" in str(error)
