"""A Baton cluster over several hosts (network namespaces; see bed.py), shared by a module:

    h1  Ray head: the first front door (and so the controller), no workers
    h2  a prefill host        h3  a decode host
    h4  a spare host for both pools, joined once the cluster is up (where replacements go)
    h5  a second front door (a replica: `baton serve --attach`)

Skipped where network namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.multinode.bed import Bed, can_make_namespaces

pytestmark = pytest.mark.slow
ADMIN_TOKEN = "bed-admin-token"
GRPC_PORT, HTTP_PORT = 50051, 8000


@dataclass
class BedCluster:
    bed: Bed
    model_dir: Path

    def grpc(self, host: int) -> str:
        return f"{self.bed.address(host)}:{GRPC_PORT}"

    def http(self, host: int) -> str:
        return f"http://{self.bed.address(host)}:{HTTP_PORT}"

    def serve(self, host: int, *extra: str) -> None:
        self.bed.spawn(
            host,
            [
                sys.executable, "-m", "router.cli", "serve", "--address", self.bed.gcs,
                "--host", self.bed.address(host), "--port", str(HTTP_PORT),
                "--grpc-port", str(GRPC_PORT), "--admin-token", ADMIN_TOKEN, *extra,
            ],
            f"frontdoor-h{host}.log",
        )  # fmt: skip
        self.bed.wait_http(host, HTTP_PORT)


@pytest.fixture(scope="module")
def bed_cluster(tiny_model_dir) -> Iterator[BedCluster]:  # type: ignore[no-untyped-def]
    why = can_make_namespaces()
    if why is not None:
        pytest.skip(why)
    model_dir = tiny_model_dir("llama")
    with Bed(num_hosts=5) as bed:
        bed.start_ray(1, num_cpus=1, resources={})
        bed.start_ray(2, num_cpus=2, resources={"prefill": 2})
        bed.start_ray(3, num_cpus=2, resources={"decode": 2})
        bed.start_ray(5, num_cpus=1, resources={})
        bed.wait_for_nodes(4)
        cluster = BedCluster(bed, model_dir)
        cluster.serve(
            1, "--model", str(model_dir), "--prefill", "1", "--decode", "1",
            "--kv-cache-gb", "0.05", "--max-num-batched-tokens", "512",
        )  # fmt: skip
        bed.start_ray(4, num_cpus=2, resources={"prefill": 2, "decode": 2})
        bed.wait_for_nodes(5)
        yield cluster
