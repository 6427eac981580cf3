"""The picture of the admin dashboard's slow requests in docs/observability.md, from a real
run: a local cluster (1 prefill + 1 decode worker on Ray, a random-weight tiny Llama, every
prompt's KV moved), its HTTP door with the slow-request keeper on and no collector, a
handful of chat requests of different lengths (some at once, so some wait their turn), then
headless Chromium (Debian's `chromium`, driven by Playwright) on /admin, the slowest request
selected.

    python -m bench.observability.slow_requests_screenshot [--out docs/images/slow_requests.png]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import tempfile
import threading
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
WORDS = [
    "the",
    "baton",
    "passes",
    "from",
    "hand",
    "to",
    "hand",
    "around",
    "the",
    "track",
    "while",
    "the",
    "crowd",
    "counts",
    "laps",
]
REQUESTS = [(8, 12), (40, 24), (120, 48), (16, 80), (200, 32), (60, 64), (24, 8), (90, 40)]
"""(prompt words x 4, output tokens) per request."""


def chat(base: str, model: str, words: int, max_tokens: int) -> None:
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(4 * words))
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for _ in r.iter_lines():
            pass


def traffic(base: str) -> None:
    model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    chat(base, model, 4, 4)  # a warm-up, so the first real request pays no first-call costs
    for batch in (REQUESTS[:3], REQUESTS[3:6], REQUESTS[6:]):
        threads = [threading.Thread(target=chat, args=(base, model, *r)) for r in batch]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def screenshot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        page = context.new_page()
        page.goto(url)
        page.locator("#timeline .span-row").first.wait_for(timeout=30_000)
        page.locator("#slow-requests").screenshot(path=str(out))
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "slow_requests.png"))
    args = parser.parse_args()

    from core.config import EngineConfig
    from engine.tiny_model import make_tiny_model
    from router.cluster.admin import ControllerAdmin
    from router.cluster.bringup import init_ray, start_cluster
    from router.cluster.spec import ClusterSpec
    from router.frontdoor.http.app import create_app
    from router.routing.route import RouterConfig
    from tests.support.http_server import HTTPServerThread

    model_dir = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny-llama", arch="llama")
    init_ray(num_cpus=16)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    spec = ClusterSpec(
        model_dir=str(model_dir),
        num_prefill=1,
        num_decode=1,
        engine=EngineConfig(num_kv_blocks=256, max_num_batched_tokens=256),
    )
    cluster = run(start_cluster(spec, RouterConfig(disagg_min_uncached_tokens=0)))
    token = secrets.token_urlsafe(12)
    app = create_app(
        cluster.backend,
        ControllerAdmin(cluster.controller, cluster.membership),
        admin_token=token,
        tracing=cluster.tracing,
        slow_requests=cluster.slow_requests,
    )
    http = HTTPServerThread(app).start()
    base = f"http://{http.host}:{http.port}"
    try:
        traffic(base)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(f"{base}/admin?token={token}", out)
        print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
    finally:
        http.stop()
        run(cluster.close())
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
