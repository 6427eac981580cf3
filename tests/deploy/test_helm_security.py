"""The chart's multi-node security: Ray's token authentication reaches every Ray container
(head, both pools, the autoscaler sidecar) from one Secret, and the NetworkPolicy lets the
release's pods talk on any port while others reach only the head's front doors."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.manifests import (
    by_kind,
    container,
    env_of,
    load_values,
    one,
    pod_templates,
    render,
    validate,
)

Manifest = dict[str, Any]


def _ray_auth_refs(docs: list[Manifest]) -> dict[str, Any]:
    """Where each Ray container (and the autoscaler) gets RAY_AUTH_TOKEN from."""
    cluster = one(docs, "RayCluster")
    refs = {}
    for group, template in pod_templates(cluster):
        env = env_of(template)
        if "RAY_AUTH_MODE" in env:
            assert env["RAY_AUTH_MODE"] == "token", group
            refs[group] = env["RAY_AUTH_TOKEN"]["secretKeyRef"]
    autoscaler_env = cluster["spec"].get("autoscalerOptions", {}).get("env", [])
    autoscaler = {e["name"]: e for e in autoscaler_env}
    if "RAY_AUTH_TOKEN" in autoscaler:
        assert autoscaler["RAY_AUTH_MODE"]["value"] == "token"
        refs["autoscaler"] = autoscaler["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    return refs


def test_ray_auth_is_on_by_default_with_one_generated_token() -> None:
    docs = render()
    refs = _ray_auth_refs(docs)
    assert set(refs) == {"head", "prefill", "decode", "autoscaler"}
    assert {(r["name"], r["key"]) for r in refs.values()} == {("baton-ray-auth", "auth_token")}
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    assert len(secrets["baton-ray-auth"]["data"]["auth_token"]) >= 40


def test_ray_auth_from_your_own_secret_creates_none() -> None:
    docs = render({"rayAuth": {"existingSecret": "mine", "key": "t"}})
    assert {(r["name"], r["key"]) for r in _ray_auth_refs(docs).values()} == {("mine", "t")}
    assert "baton-ray-auth" not in {s["metadata"]["name"] for s in by_kind(docs, "Secret")}


def test_ray_auth_off_sets_nothing() -> None:
    docs = render({"rayAuth": {"enabled": False}})
    assert _ray_auth_refs(docs) == {}
    assert len(by_kind(docs, "Secret")) == 1  # the admin token's only


# -- NetworkPolicy ---------------------------------------------------------------------


def _selects(selector: Manifest, labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def admits(policy: Manifest, source: dict[str, str], target: Manifest, port: int) -> bool:
    """Would `policy` let a pod labelled `source` (same namespace) reach `port` of the pod
    `target` (a pod template)? Plain matchLabels peers and ports, which is all the chart
    writes; a pod the policy does not select is not isolated by it."""
    spec, labels = policy["spec"], target["metadata"]["labels"]
    if not _selects(spec["podSelector"], labels):
        return True
    named = {p["name"]: p["containerPort"] for p in container(target).get("ports", [])}
    for rule in spec.get("ingress", []):
        ports = rule.get("ports")
        port_ok = ports is None or any(named.get(p["port"], p["port"]) == port for p in ports)
        peers = rule.get("from")
        peer_ok = peers is None or any(
            "namespaceSelector" not in peer and _selects(peer.get("podSelector", {}), source)
            for peer in peers
        )
        if port_ok and peer_ok:
            return True
    return False


def _policy_and_pods(values: dict[str, Any]) -> tuple[Manifest, dict[str, Manifest]]:
    docs = render(values)
    policy = one(docs, "NetworkPolicy")
    validate(policy)
    pods = dict(pod_templates(one(docs, "RayCluster")))
    for deployment in by_kind(docs, "Deployment"):  # the bundled Redis
        pods["redis"] = deployment["spec"]["template"]
    return policy, pods


def test_network_policy_is_off_by_default() -> None:
    assert by_kind(render(), "NetworkPolicy") == []


def test_release_pods_reach_each_other_on_any_port() -> None:
    values = {"networkPolicy": {"enabled": True}, "redis": {"enabled": True}}
    policy, pods = _policy_and_pods(values)
    assert set(pods) == {"head", "prefill", "decode", "redis"}
    for name, pod in pods.items():
        assert _selects(policy["spec"]["podSelector"], pod["metadata"]["labels"]), name
    prefill = pods["prefill"]["metadata"]["labels"]
    for target, port in (("head", 6379), ("decode", 43117), ("redis", 6379), ("head", 10001)):
        assert admits(policy, prefill, pods[target], port), (target, port)


def test_others_reach_only_the_front_doors() -> None:
    policy, pods = _policy_and_pods({"networkPolicy": {"enabled": True}})
    stranger = {"app": "somebody-else"}
    assert admits(policy, stranger, pods["head"], 8000)
    assert admits(policy, stranger, pods["head"], 50051)
    for target, port in (("head", 6379), ("head", 8265), ("head", 10001), ("decode", 8000)):
        assert not admits(policy, stranger, pods[target], port), (target, port)


def test_front_doors_can_be_limited_to_some_peers() -> None:
    peer = [{"podSelector": {"matchLabels": {"role": "gateway"}}}]
    policy, pods = _policy_and_pods({"networkPolicy": {"enabled": True, "frontDoorFrom": peer}})
    assert admits(policy, {"role": "gateway"}, pods["head"], 8000)
    assert not admits(policy, {"app": "somebody-else"}, pods["head"], 8000)


@pytest.mark.parametrize("port", [8000, 6379])
def test_policy_check_can_fail(port: int) -> None:
    """The evaluator above says no when a policy lets nothing in."""
    policy, pods = _policy_and_pods({"networkPolicy": {"enabled": True}})
    policy["spec"]["ingress"] = []
    assert not admits(policy, pods["prefill"]["metadata"]["labels"], pods["head"], port)


def test_rdma_example_locks_the_front_doors_to_its_ingress() -> None:
    policy, pods = _policy_and_pods(load_values("gpu-tp2-values.yaml"))
    assert not admits(policy, {"app": "somebody-else"}, pods["head"], 8000)
