"""The `ray up` cluster configs (deploy/ray/*.yaml) validate against Ray's own cluster-config
schema after the same preparation `ray up` does, and their start commands run a
`baton serve --address auto` the CLI accepts, with pools that fit the node types."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.serve_command import parse_serve, serve_argv_in_shell

prepare = pytest.importorskip("ray.autoscaler._private.util", reason="needs ray")

RAY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "ray"
CONFIGS = sorted(RAY_DIR.glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _serve_commands(config: dict[str, Any]) -> list[list[str]]:
    commands = config.get("head_start_ray_commands", []) + config.get("head_setup_commands", [])
    return [argv for c in commands if (argv := serve_argv_in_shell(c)) is not None]


def test_there_is_a_cloud_and_an_onprem_config() -> None:
    providers = {_load(p)["provider"]["type"] for p in CONFIGS}
    assert "local" in providers
    assert providers - {"local"}, "a cloud provider example"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates_against_rays_schema(path: Path) -> None:
    config = _load(path)
    # Raw file against the schema first (prepare_config fills defaults that could hide a
    # misspelt top-level key), then the prepared config the way `ray up` checks it.
    schema_path = Path(prepare.__file__).parents[1] / "ray-schema.json"
    jsonschema.validate(config, json.loads(schema_path.read_text()))
    prepare.validate_config(prepare.prepare_config(copy.deepcopy(config)))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_head_runs_one_serve_the_cli_accepts(path: Path) -> None:
    config = _load(path)
    commands = _serve_commands(config)
    assert len(commands) == 1, "the head starts exactly one `baton serve`"
    args = parse_serve(commands[0])
    assert args.address == "auto", "serve joins the Ray cluster `ray up` started"
    assert args.host == "0.0.0.0"
    assert args.model is not None
    # serve runs after Ray's head is up, in the background so `ray up` returns.
    start = config["head_start_ray_commands"]
    serve_at = next(i for i, c in enumerate(start) if serve_argv_in_shell(c))
    assert any("ray start --head" in c for c in start[:serve_at])
    assert start[serve_at].startswith("nohup ") and " & " in start[serve_at]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_head_holds_no_gpu_for_workers(path: Path) -> None:
    config = _load(path)
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--num-gpus=0" in head_start


def test_cloud_pools_fit_their_node_types() -> None:
    for path in CONFIGS:
        config = _load(path)
        if config["provider"]["type"] == "local":
            continue
        args = parse_serve(_serve_commands(config)[0])
        types = config["available_node_types"]
        for role, wanted in (("prefill", args.prefill), ("decode", args.decode)):
            pool_types = {n: t for n, t in types.items() if role in t["resources"]}
            assert pool_types, f"{path.name}: no node type advertises `{role}`"
            for name, node_type in pool_types.items():
                resources = node_type["resources"]
                other = "decode" if role == "prefill" else "prefill"
                assert other not in resources, f"{name} serves one pool only"
                # Each worker takes `tp` GPUs and one unit of its pool's resource.
                assert resources[role] * args.tp == resources["GPU"], name
            # The pool's starting workers fit on the nodes kept up from the start.
            at_start = sum(
                t.get("min_workers", 0) * t["resources"][role] for t in pool_types.values()
            )
            assert at_start >= wanted, f"{path.name}: {wanted} {role} workers need more nodes"


def test_onprem_hosts_declare_their_pool() -> None:
    config = _load(RAY_DIR / "baton-onprem.yaml")
    worker_start = " ".join(config["worker_start_ray_commands"])
    assert "--resources=" in worker_start and "/etc/baton/ray-resources.json" in worker_start


def test_serve_command_extraction_stops_at_shell_operators() -> None:
    line = 'nohup baton serve --port 8000 --admin-token "$(cat ~/t)" > log 2>&1 & echo $!'
    assert serve_argv_in_shell(line) == [
        "baton",
        "serve",
        "--port",
        "8000",
        "--admin-token",
        "$(cat ~/t)",
    ]
    assert serve_argv_in_shell("ray start --head") is None
    with pytest.raises(AssertionError, match="rejects"):
        parse_serve(["baton", "serve", "--no-such-flag"])
