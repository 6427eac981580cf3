"""The two-node walkthrough in docs/deploy.md is true of the chart: its values file renders,
validates, and runs the `baton serve` the walkthrough says it does."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml

from tests.deploy.manifests import container, env_of, one, pod_templates, render, validate
from tests.deploy.serve_command import expand_kubelet_refs, parse_serve

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def _two_node_values() -> dict:
    text = DOC.read_text()
    walkthrough = text[text.index("`two-node.yaml`") :]
    block = re.search(r"```yaml\n(.*?)```", walkthrough, flags=re.DOTALL)
    assert block, "docs/deploy.md: no yaml block after `two-node.yaml`"
    return yaml.safe_load(textwrap.dedent(block.group(1)))


def test_two_node_walkthrough_values_deploy_what_the_doc_says() -> None:
    docs = render(_two_node_values())
    for doc in docs:
        validate(doc)
    pods = dict(pod_templates(one(docs, "RayCluster")))
    head = container(pods["head"])
    argv = expand_kubelet_refs(head["args"][2:], set(env_of(pods["head"])))
    args = parse_serve(argv)
    # "--prefill 4 --decode 4 --tp 2 --transport nixl --address auto"
    assert (args.prefill, args.decode, args.tp) == (4, 4, 2)
    assert (args.transport, args.address) == ("nixl", "auto")
    for group, host in (("prefill", "gpu-a"), ("decode", "gpu-b")):
        spec = pods[group]["spec"]
        assert spec["nodeSelector"]["kubernetes.io/hostname"] == host
        assert env_of(pods[group])["UCX_TLS"].startswith("rc,")
    assert one(docs, "NetworkPolicy")
