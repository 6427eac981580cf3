"""Every node a `ray up` config starts runs `ray start` with the cross-node KV transport
settings in its environment (Baton's workers inherit Ray's), and none keeps KV on
loopback; every node requires Ray's auth token."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

RAY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "ray"
CONFIGS = sorted(RAY_DIR.glob("*.yaml"))
REQUIRED = ("UCX_NET_DEVICES", "UCX_TLS")
_BASHRC_LINE = re.compile(r"echo '(export [^']*)' >> ~/\.bashrc")


def exported_env(command: str) -> dict[str, str]:
    """NAME=value pairs a shell command line `export`s before it runs `ray start`."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    env: dict[str, str] = {}
    for i, word in enumerate(words):
        if word == "ray" and words[i + 1 : i + 2] == ["start"]:
            break
        if word == "export":
            for assignment in words[i + 1 :]:
                if "=" not in assignment:
                    break
                name, _, value = assignment.partition("=")
                env[name] = value
    return env


def docker_env(config: dict[str, Any]) -> dict[str, str]:
    """--env NAME=value options of the container every node runs in."""
    env = {}
    for option in config.get("docker", {}).get("run_options", []):
        flag, _, assignment = option.partition(" ")
        if flag in ("--env", "-e"):
            name, _, value = assignment.partition("=")
            env[name] = value
    return env


def bashrc_env(config: dict[str, Any]) -> dict[str, str]:
    """What setup commands append to ~/.bashrc, which Ray sources before every command."""
    env = {}
    for command in config.get("setup_commands", []):
        for line in _BASHRC_LINE.findall(command):
            env |= exported_env(line)
    return env


def ray_start_env(config: dict[str, Any], key: str) -> dict[str, str]:
    """What the `ray start` among `key`'s commands sees: the container's env, ~/.bashrc,
    then the command's own exports."""
    (start,) = [c for c in config[key] if "ray start" in c]
    return docker_env(config) | bashrc_env(config) | exported_env(start)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("key", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_every_node_starts_ray_with_the_transport_settings(path: Path, key: str) -> None:
    env = ray_start_env(yaml.safe_load(path.read_text()), key)
    for name in REQUIRED:
        assert env.get(name), f"{path.name} {key}: {name} unset"
    assert "lo" not in env["UCX_NET_DEVICES"].split(","), "KV would never leave the node"
    assert "cuda_copy" in env["UCX_TLS"].split(","), "GPU memory needs cuda_copy (or RDMA)"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("key", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_every_node_requires_rays_token(path: Path, key: str) -> None:
    """RAY_AUTH_MODE=token on every node, with the token `ray get-auth-token --generate`
    wrote on the launching machine mounted where Ray looks for it by default."""
    config = yaml.safe_load(path.read_text())
    assert ray_start_env(config, key).get("RAY_AUTH_MODE") == "token", f"{path.name} {key}"
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"


def test_environment_parsing() -> None:
    line = "ulimit -n 9; export A=1 B=^lo; . /etc/x.env; ray start --head; export C=3"
    assert exported_env(line) == {"A": "1", "B": "^lo"}
    config = {"docker": {"run_options": ["--shm-size=1g", "--env A=2", "-e D=lo"]}}
    assert docker_env(config) == {"A": "2", "D": "lo"}
    config["worker_start_ray_commands"] = ["ray stop", "export A=3; ray start --address=h:1"]
    assert ray_start_env(config, "worker_start_ray_commands") == {"A": "3", "D": "lo"}
    config["setup_commands"] = ["grep -q E ~/.bashrc || echo 'export E=5' >> ~/.bashrc"]
    assert bashrc_env(config) == {"E": "5"}
