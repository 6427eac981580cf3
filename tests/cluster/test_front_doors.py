"""The front doors over the real cluster (what `baton serve` runs): the `openai` client and
gRPC through prefill -> KV transfer -> decode, and the dashboard scaling a real pool."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests import oracle
from tests.cluster.conftest import ADMIN_TOKEN as TOKEN

pytestmark = pytest.mark.slow


def test_openai_client_through_the_cluster(served) -> None:  # type: ignore[no-untyped-def]
    from openai import OpenAI

    cluster, http, _, model_dir = served
    client = OpenAI(base_url=f"{http.url}/v1", api_key="unused")
    name = cluster.backend.model_name
    prompt_ids = list(range(40, 240))
    reply = client.completions.create(model=name, prompt=prompt_ids, max_tokens=8, temperature=0)
    expected = oracle.hf_greedy(str(model_dir), tuple(prompt_ids), 8)
    assert reply.choices[0].text == cluster.backend.tokenizer.decode(expected)
    assert reply.usage.completion_tokens == 8 and reply.usage.prompt_tokens == 200
    chunks = list(
        client.completions.create(
            model=name, prompt=prompt_ids, max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Tell me about batons."}], max_tokens=6
    )
    assert chat.usage.completion_tokens <= 6
    assert cluster.backend.transfers.num_transfers >= 3  # every request moved KV


def test_grpc_through_the_cluster(served) -> None:  # type: ignore[no-untyped-def]
    from router.frontdoor.grpc.client import BatonClient

    _, _, grpc, _ = served
    with BatonClient(grpc.target) as client:
        text = "".join(
            c.text for c in client.generate("Hello, cluster", max_tokens=6, temperature=0)
        )
        reply = client.complete("Hello, cluster", max_tokens=6, temperature=0)
    assert text == reply.text


def test_metrics_show_the_cluster(served) -> None:  # type: ignore[no-untyped-def]
    import httpx

    _, http, _, _ = served
    body = httpx.get(f"{http.url}/metrics", timeout=10).text
    for name in (
        "baton:time_to_first_token_seconds",
        "baton:kv_cache_usage_perc",
        "baton:prefix_cache_hit_rate",
        "baton:kv_transfer_seconds",
    ):
        assert name in body


def kv_bytes_per_block(model_dir) -> int:  # type: ignore[no-untyped-def]
    """K and V of one block over every layer, from the checkpoint's own config (fp32 on CPU)."""
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    block_size, fp32 = 16, 4
    return 2 * block_size * cfg["num_key_value_heads"] * head_dim * fp32 * cfg["num_hidden_layers"]


def test_kv_transfer_bytes_count_what_moved(served) -> None:  # type: ignore[no-untyped-def]
    """A 200-token prompt no worker has seen fills 13 blocks on the prefill worker, and every
    one of them moves to the decode worker: the counter grows by exactly their bytes."""
    import random

    import httpx

    cluster, http, _, model_dir = served

    def moved() -> float:
        body = httpx.get(f"{http.url}/metrics", timeout=10).text
        return next(
            float(line.split()[-1])
            for line in body.splitlines()
            if line.startswith("baton:kv_transfer_bytes_total ")
        )

    before, blocks_before = moved(), cluster.backend.transfers.num_blocks_sent
    prompt = random.Random(7).sample(range(3, 1000), 200)
    body = {"model": cluster.backend.model_name, "prompt": prompt, "max_tokens": 2}
    assert httpx.post(f"{http.url}/v1/completions", json=body, timeout=60).status_code == 200
    assert cluster.backend.transfers.num_blocks_sent - blocks_before == 13
    assert moved() - before == 13 * kv_bytes_per_block(model_dir)


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian chromium")
def test_dashboard_scales_the_real_decode_pool(served) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("playwright.sync_api")
    from playwright.sync_api import sync_playwright

    cluster, http, _, _ = served
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ]
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=shutil.which("chromium"), args=args, headless=True
        )
        context.set_default_timeout(30_000)
        page = context.new_page()
        assert page.goto(f"{http.url}/admin?token=wrong").status == 401
        assert page.goto(f"{http.url}/admin?token={TOKEN}").status == 200
        page.locator("#pool-prefill").wait_for()
        page.locator("#pool-decode").wait_for()
        assert page.locator("#pool-decode tr.worker").count() == 1
        page.click("#scale-decode-up")
        # A real worker actor starts, connects its transport, and the page shows it ready.
        page.wait_for_function(
            "[...document.querySelectorAll('#pool-decode tr.worker')]"
            ".filter(r => r.textContent.includes('ready')).length === 2",
            timeout=90_000,
        )
        context.close()
    assert sum(1 for m in cluster.membership.workers.values() if m.role == "decode") >= 1
