"""The chart's cross-node KV transport settings (kvTransport, commonEnv, a pool's own
kvTransport and securityContext) reach the environment of every Ray pod they should, and
only when set; loopback is refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.manifests import (
    container,
    env_of,
    helm_python,
    load_values,
    one,
    pod_templates,
    render,
    validate,
)

TRANSPORT = {
    "kvTransport": {
        "netDevices": "mlx5_0:1,mlx5_1:1",
        "tls": "rc,cuda_copy,tcp",
        "ibGidIndex": "3",
        "nixlLogLevel": "INFO",
        "env": [{"name": "UCX_LOG_LEVEL", "value": "info"}],
    },
    "commonEnv": [{"name": "BATON_FUSED_KERNELS", "value": "0"}],
    "decode": {
        "kvTransport": {"netDevices": "mlx5_2:1"},
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    },
}
EXPECTED = {
    "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1",
    "UCX_TLS": "rc,cuda_copy,tcp",
    "UCX_IB_GID_INDEX": "3",
    "NIXL_LOG_LEVEL": "INFO",
    "UCX_LOG_LEVEL": "info",
    "BATON_FUSED_KERNELS": "0",
}
TRANSPORT_VARS = {"UCX_NET_DEVICES", "UCX_TLS", "UCX_IB_GID_INDEX", "NIXL_LOG_LEVEL"}


def _pods(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    docs = render(values)
    for doc in docs:
        validate(doc)
    return dict(pod_templates(one(docs, "RayCluster")))


def test_settings_reach_every_ray_pod_with_a_pools_override() -> None:
    pods = _pods(TRANSPORT)
    assert set(pods) == {"head", "prefill", "decode"}
    for group, template in pods.items():
        expected = dict(EXPECTED)
        if group == "decode":
            expected["UCX_NET_DEVICES"] = "mlx5_2:1"
        env = env_of(template)
        assert {k: env.get(k) for k in expected} == expected, group
    assert container(pods["decode"])["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert "securityContext" not in container(pods["prefill"])


def test_defaults_keep_kv_off_loopback_and_leave_the_rest_to_ucx() -> None:
    for group, template in _pods({}).items():
        env = env_of(template)
        assert env["UCX_NET_DEVICES"] == "^lo", group
        assert not TRANSPORT_VARS - {"UCX_NET_DEVICES"} & set(env), group


def test_an_empty_value_leaves_the_variable_unset() -> None:
    for group, template in _pods({"kvTransport": {"netDevices": ""}}).items():
        assert "UCX_NET_DEVICES" not in env_of(template), group


@pytest.mark.parametrize(
    "values",
    [
        {"kvTransport": {"netDevices": "lo"}},
        {"kvTransport": {"netDevices": "eth0,lo"}},
        {"prefill": {"kvTransport": {"netDevices": "lo"}}},
    ],
)
def test_loopback_is_refused(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError, match="must not name lo"):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"kvTransport": {"nixlLogLevel": "LOUD"}},
        {"kvTransport": {"ibGidIndex": "three"}},
        {"kvTransport": {"netDevice": "eth0"}},  # a typo in a key
        {"decode": {"kvTransport": {"env": []}}},  # extra variables are cluster-wide only
    ],
)
def test_schema_rejects_bad_transport_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(values)


def test_rdma_example_sets_rdma_transports_on_both_pools() -> None:
    pods = _pods(load_values("gpu-tp2-values.yaml"))
    for group in ("prefill", "decode"):
        env = env_of(pods[group])
        assert env["UCX_TLS"].split(",")[0] == "rc", group
        assert "lo" not in env["UCX_NET_DEVICES"].split(","), group
        assert "IPC_LOCK" in container(pods[group])["securityContext"]["capabilities"]["add"]
