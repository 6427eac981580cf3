"""The Helm chart (deploy/helm/baton) renders with Helm's engine, every manifest validates
against the Kubernetes and CRD schemas, and what it deploys fits together: the head runs a
`baton serve` the CLI accepts, pools are pinned by custom resources, the Services and the
ServiceMonitor reach the ports the head opens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.deploy.manifests import (
    CHART_DIR,
    by_kind,
    container,
    crd_documents,
    helm_python,
    load_values,
    one,
    render,
    validate,
)
from tests.deploy.serve_command import expand_kubelet_refs, parse_serve

VARIANTS = {
    "defaults": {},
    "cpu-small": load_values("cpu-small-values.yaml"),
    "gpu-tp2": load_values("gpu-tp2-values.yaml"),
    # The colocated baseline: every worker asks for `unified`, so both groups offer it.
    "unified": {"serve": {"mode": "unified"}},
    # Two workers on each GPU: one-GPU pods of two workers each.
    "shared-gpus": {"serve": {"gpusPerWorker": 0.5}, "prefill": {"gpu": {"count": 1}},
                    "decode": {"gpu": {"count": 1}}},
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(merged values, rendered manifests) of one variant."""
    values = VARIANTS[request.param]
    with helm_python.Chart.load(CHART_DIR) as chart:
        merged = chart.merge_values(values)
    return merged, render(values)


def _ray_resources(group: dict[str, Any]) -> dict[str, int]:
    """The custom resources a group's `ray start --resources` declares. KubeRay passes the
    value to the shell as written, so it is a quoted JSON string."""
    raw = group["rayStartParams"]["resources"]
    assert raw.startswith('"') and raw.endswith('"'), raw
    return json.loads(raw[1:-1].replace('\\"', '"'))


def _head_serve(docs: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    cluster = one(docs, "RayCluster")
    head = container(cluster["spec"]["headGroupSpec"]["template"])
    # bash -c SCRIPT LABEL ARG...: the script ends in `exec "$@"`, so ARG... is what runs.
    assert head["command"] == ["/bin/bash", "-c"]
    script, argv = head["args"][0], head["args"][2:]
    assert script.rstrip().endswith('exec "$@"')
    assert "KUBERAY_GEN_RAY_START_CMD" in script
    env_names = {e["name"] for e in head.get("env", [])}
    return parse_serve(expand_kubelet_refs(argv, env_names)), head


def test_crds_shipped_in_repo_are_valid_crds() -> None:
    crds = crd_documents()
    kinds = {c["spec"]["names"]["kind"] for c in crds}
    assert kinds == {"RayCluster", "ServiceMonitor", "PrometheusRule"}
    for crd in crds:
        validate(crd)


def test_every_manifest_validates(variant: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    _, docs = variant
    assert docs
    for doc in docs:
        validate(doc)


def test_helm_lint_is_clean() -> None:
    for values in VARIANTS.values():
        report = helm_python.lint(CHART_DIR, values, strict=True)
        errors = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not errors, errors


def test_head_runs_a_serve_command_the_cli_accepts(variant) -> None:
    values, docs = variant
    args, head = _head_serve(docs)
    assert args.command == "serve"
    assert args.address == "auto"
    assert args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert (args.port, args.grpc_port) == (ports["http"], ports["grpc"])
    assert (args.port, args.grpc_port) == (values["serve"]["port"], values["serve"]["grpcPort"])
    assert args.tp == values["serve"]["tp"]
    assert args.admin_token == "<BATON_ADMIN_TOKEN>"
    expected_model = values["model"]["mountPath"].rstrip("/")
    if values["model"]["path"]:
        expected_model += "/" + values["model"]["path"]
    assert args.model == expected_model
    mounts = {m["name"]: m["mountPath"] for m in head["volumeMounts"]}
    assert mounts["model"] == values["model"]["mountPath"]


def test_pools_are_pinned_and_sized(variant) -> None:
    values, docs = variant
    args, _ = _head_serve(docs)
    cluster = one(docs, "RayCluster")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"prefill", "decode"}
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    tp = values["serve"]["tp"]
    for role, requested_workers in (("prefill", args.prefill), ("decode", args.decode)):
        pool, group = values[role], groups[role]
        resources = _ray_resources(group)
        resource = "unified" if values["serve"]["mode"] == "unified" else role
        assert set(resources) == {resource}, "a pool's nodes advertise only their own resource"
        per_pod = resources[resource]
        gpus = pool["gpu"]["count"]
        assert group["rayStartParams"]["num-gpus"] == str(gpus)
        share = values["serve"]["gpusPerWorker"]
        assert args.gpus_per_worker == share
        if pool["workersPerPod"]:
            assert per_pod == pool["workersPerPod"]
        elif gpus and share < 1:
            assert per_pod == int(gpus / share)  # the workers sharing each GPU
        elif gpus:
            assert per_pod * tp == gpus
        else:
            assert per_pod == 1
        # The pool starts with exactly what its starting pods hold.
        assert requested_workers == per_pod * pool["replicas"]
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
            pool["replicas"],
            pool["minReplicas"],
            pool["maxReplicas"],
        )
        worker = container(group["template"])
        limits = worker["resources"].get("limits", {})
        if gpus:
            assert limits[pool["gpu"]["resourceName"]] == gpus
        else:
            assert pool["gpu"]["resourceName"] not in limits
        selector = group["template"]["spec"].get("nodeSelector", {})
        if pool["gpu"]["product"]:
            assert selector["nvidia.com/gpu.product"] == pool["gpu"]["product"]
        mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
        assert mounts["model"] == values["model"]["mountPath"]
    expected_device = "cuda" if values["prefill"]["gpu"]["count"] else "cpu"
    assert args.device == (values["serve"]["device"] or expected_device)


def test_front_door_service_and_monitor_reach_the_head(variant) -> None:
    values, docs = variant
    cluster = one(docs, "RayCluster")
    head = container(cluster["spec"]["headGroupSpec"]["template"])
    named_ports = {p["name"] for p in head["ports"]}
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    front = services[cluster["metadata"]["name"]]
    # KubeRay labels the head pod with these; the Service must select exactly it.
    assert front["spec"]["selector"] == {
        "ray.io/cluster": cluster["metadata"]["name"],
        "ray.io/node-type": "head",
    }
    assert front["spec"]["type"] == values["service"]["type"]
    assert {p["name"]: p["port"] for p in front["spec"]["ports"]} == {
        "http": values["service"]["httpPort"],
        "grpc": values["service"]["grpcPort"],
    }
    for port in front["spec"]["ports"]:
        assert port["targetPort"] in named_ports
    assert head["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    monitors = by_kind(docs, "ServiceMonitor")
    assert len(monitors) == int(values["serviceMonitor"]["enabled"])
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= front["metadata"]["labels"].items()
        assert monitor["spec"]["endpoints"] == [
            {"port": "http", "path": "/metrics", "interval": values["serviceMonitor"]["interval"]}
        ]


def test_secrets_and_redis_are_wired(variant) -> None:
    values, docs = variant
    args, head = _head_serve(docs)
    env = {e["name"]: e for e in head["env"]}
    ref = env["BATON_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] == values["adminToken"]["key"]
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    if values["adminToken"]["existingSecret"]:
        assert ref["name"] == values["adminToken"]["existingSecret"]
        assert ref["name"] not in secrets
    else:
        token = secrets[ref["name"]]["data"][ref["key"]]
        assert len(token) >= 40  # base64 of a 40-character random token
    assert (args.api_key is not None) == bool(values["apiKey"]["existingSecret"])
    services = {s["metadata"]["name"] for s in by_kind(docs, "Service")}
    redis = values["redis"]
    if redis["enabled"]:
        host = args.redis.removeprefix("redis://").split(":")[0]
        assert host in services
        assert one(docs, "Deployment")["spec"]["replicas"] == 1
    elif redis["existingSecret"]:
        assert args.redis == "<BATON_REDIS_URL>"
        redis_ref = env["BATON_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert redis_ref["name"] == redis["existingSecret"]
    else:
        assert args.redis is None


def test_generated_admin_token_is_random_per_install() -> None:
    def admin_token() -> str:
        secrets = {s["metadata"]["name"]: s for s in by_kind(render(), "Secret")}
        return secrets["baton-admin"]["data"]["admin-token"]

    assert admin_token() != admin_token()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"serve": {"tp": 3}}, "must be a multiple of serve.tp"),
        ({"serve": {"tp": 2, "gpusPerWorker": 0.5}}, "takes whole GPUs"),
        ({"prefill": {"minReplicas": 5}}, "minReplicas must not exceed"),
        ({"redis": {"enabled": True, "externalUrl": "redis://r:6379/0"}}, "only one of redis"),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(values, message) -> None:
    with pytest.raises(helm_python.HelmError, match=message):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"prefil": {"replicas": 1}},  # a typo in a key
        {"serve": {"mode": "colocated"}},
        {"prefill": {"gpu": {"count": -1}}},
        {"model": {"source": "s3"}},
        {"serve": {"gpusPerWorker": 1.5}},
    ],
)
def test_values_schema_rejects_bad_values(values) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(values)


def _broken(path: str) -> dict[str, Any]:
    """The default RayCluster with one field misspelt or mistyped (dotted path, last key)."""
    cluster = one(render(), "RayCluster")
    *parents, last = path.split(".")
    node: Any = cluster
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last + "s"] = node.pop(last)
    return cluster


@pytest.mark.parametrize(
    "path",
    [
        "spec.workerGroupSpecs",  # RayCluster field (CRD schema)
        "spec.headGroupSpec.rayStartParams",  # RayCluster field (CRD schema)
        "spec.workerGroupSpecs.0.template.spec.volumes",  # pod template (core/v1 schema)
        "spec.headGroupSpec.template.spec.containers.0.readinessProbe",
        "metadata.labels",  # ObjectMeta
    ],
)
def test_validation_catches_a_misspelt_field(path: str) -> None:
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        validate(_broken(path))


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_cuda_graphs_value_reaches_the_engine_config(cuda_graphs: bool) -> None:
    from router.cli.serve import build_spec

    args, _ = _head_serve(render({"serve": {"cudaGraphs": cuda_graphs}}))
    assert build_spec(args, args.model).engine.cuda_graphs is cuda_graphs


def test_gpus_per_worker_reaches_the_cluster_spec() -> None:
    from router.cli.serve import build_spec

    values = VARIANTS["shared-gpus"]
    args, _ = _head_serve(render(values))
    spec = build_spec(args, args.model)
    assert spec.gpus_per_worker == 0.5
    assert (args.prefill, args.decode) == (2, 2)  # one pod a pool, two workers on its GPU


@pytest.mark.parametrize("quantization", [None, "int8", "w8a8"])
def test_quantization_value_reaches_the_engine_config(quantization: str | None) -> None:
    from router.cli.serve import build_spec

    args, _ = _head_serve(render({"serve": {"quantization": quantization}}))
    assert build_spec(args, args.model).engine.quantization == quantization


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8", "fp8"])
def test_kv_cache_dtype_value_reaches_the_engine_config(kv_cache_dtype: str) -> None:
    from router.cli.serve import build_spec

    docs = render({"serve": {"kvCacheDtype": kv_cache_dtype}})
    for doc in docs:
        validate(doc)
    args, _ = _head_serve(docs)
    assert build_spec(args, args.model).engine.kv_cache_dtype == kv_cache_dtype


def test_speculative_values_reach_the_engine_config(tmp_path: Path) -> None:
    from router.cli.serve import build_spec

    args, _ = _head_serve(render({}))
    assert build_spec(args, args.model).engine.speculative is None  # off by default
    args, _ = _head_serve(render({"serve": {"speculative": "ngram", "numSpeculativeTokens": 3}}))
    engine = build_spec(args, args.model).engine
    assert (engine.speculative, engine.num_speculative_tokens) == ("ngram", 3)
    (tmp_path / "config.json").write_text("{}")
    docs = render({"serve": {"speculative": "draft", "speculativeModel": str(tmp_path)}})
    for doc in docs:
        validate(doc)
    args, _ = _head_serve(docs)
    engine = build_spec(args, args.model).engine
    assert (engine.speculative, engine.speculative_model) == ("draft", str(tmp_path))


def test_kv_offload_values_reach_the_engine_config_and_the_disk_tier_gets_a_volume() -> None:
    from router.cli.serve import build_spec

    docs = render({"serve": {"kvOffloadHostGb": 2, "kvOffloadDiskGb": 8}})
    for doc in docs:
        validate(doc)
    args, _ = _head_serve(docs)
    engine = build_spec(args, args.model).engine
    assert (engine.kv_offload_host_bytes, engine.kv_offload_disk_bytes) == (2 << 30, 8 << 30)
    for group in one(docs, "RayCluster")["spec"]["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in container(group["template"])["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert mounts["kv-offload"] == engine.kv_offload_dir
        assert volumes["kv-offload"]["emptyDir"]["sizeLimit"] == "8Gi"
    args, _ = _head_serve(render({}))
    assert build_spec(args, args.model).engine.kv_offload_host_bytes == 0  # off by default


def test_limits_values_reach_the_door_limits() -> None:
    from router.cli.serve_args import door_limits
    from router.frontdoor.limits import DoorLimits

    args, _ = _head_serve(render({}))
    assert door_limits(args) == DoorLimits()  # off by default
    limits = {"rateLimit": 2.5, "rateBurst": 5, "maxConcurrentPerKey": 3,
              "maxConcurrentRequests": 64, "maxQueuedRequests": 16, "queueTimeout": 10,
              "maxBodyBytes": 1 << 20}  # fmt: skip
    args, _ = _head_serve(render({"serve": {"limits": limits}}))
    assert door_limits(args) == DoorLimits(
        rate_per_s=2.5, burst=5, max_concurrent_per_key=3, max_concurrent=64, max_queued=16,
        queue_timeout_s=10, max_body_bytes=1 << 20,
    )  # fmt: skip


def test_autoscale_values_reach_the_autoscaler() -> None:
    from router.cli.serve_args import autoscale_config
    from router.cluster.autoscale.policy import AutoscaleConfig

    args, _ = _head_serve(render({}))
    assert autoscale_config(args) is None  # off by default
    values = {"enabled": True, "ttftSlo": 1.5, "itlSlo": 0.1, "minPrefill": 1, "maxPrefill": 6,
              "minDecode": 2, "maxDecode": 5, "interval": 3, "scaleUpCooldown": 20,
              "scaleDownCooldown": 120, "scaleUpLead": 45, "scaleDownHeadroom": 0.6}  # fmt: skip
    args, _ = _head_serve(render({"serve": {"autoscale": values}}))
    assert autoscale_config(args) == AutoscaleConfig(
        ttft_slo_s=1.5, itl_slo_s=0.1, min_sizes={"prefill": 1, "decode": 2},
        max_sizes={"prefill": 6, "decode": 5}, interval_s=3, up_cooldown_s=20,
        down_cooldown_s=120, lead_s=45, down_headroom=0.6,
    )  # fmt: skip
