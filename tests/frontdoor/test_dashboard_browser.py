"""The dashboard in a real headless Chromium (Debian `chromium`, driven by Playwright)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from tests.frontdoor.conftest import ADMIN_TOKEN, API_KEY
from tests.support.http_server import HTTPServerThread
from tests.support.in_process_admin import InProcessAdmin

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def page() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=ARGS, headless=True
        )
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        yield page
        context.close()


def test_wrong_token_is_refused(page, server: HTTPServerThread) -> None:  # type: ignore[no-untyped-def]
    response = page.goto(f"{server.url}/admin?token=wrong")
    assert response.status == 401
    assert page.locator("#refused").is_visible()
    assert page.locator(".pool").count() == 0


def test_dashboard_shows_pools_and_scales_decode(  # type: ignore[no-untyped-def]
    page, server: HTTPServerThread, admin: InProcessAdmin, backend
) -> None:
    # Some traffic first, so the charts have points.
    httpx.post(
        f"{server.url}/v1/completions",
        timeout=30,
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": backend.model_name, "prompt": "hi", "max_tokens": 4},
    ).raise_for_status()
    response = page.goto(f"{server.url}/admin?token={ADMIN_TOKEN}")
    assert response.status == 200
    page.locator("#pool-prefill").wait_for()
    page.locator("#pool-decode").wait_for()
    assert "token=" not in page.url  # dropped from the address bar
    decode_rows = page.locator("#pool-decode tr.worker")
    before = len(admin.workers("decode"))
    assert decode_rows.count() == before
    page.click("#scale-decode-up")
    page.wait_for_function(
        f"document.querySelectorAll('#pool-decode tr.worker').length === {before + 1}",
        timeout=TIMEOUT_MS,
    )
    new_ids = {w.worker_id for w in admin.workers("decode")}
    shown = set(decode_rows.evaluate_all("rows => rows.map(r => r.dataset.workerId)"))
    assert shown == new_ids and len(new_ids) == before + 1
    assert "ready" in page.locator("#pool-decode").inner_text()
    # The charts polled the stats endpoint and drew something other than "no requests".
    page.wait_for_function("document.getElementById('status').textContent.startsWith('updated')")


def test_dashboard_lists_the_autoscalers_last_decisions(  # type: ignore[no-untyped-def]
    page, server: HTTPServerThread, admin: InProcessAdmin
) -> None:
    signals = {"ready": 1, "queued": 3, "oldest_wait_s": 1.5, "ttft_p90_s": None}
    admin.autoscale_history = [
        {"pool": "prefill", "size": 1, "target": 2, "pressure": 1.5, "at": 1.0e9,
         "reason": "queue wait over target", "signals": signals},
        {"pool": "decode", "size": 2, "target": 1, "pressure": 0.2, "at": 1.0e9 + 60,
         "reason": "calm for 5 periods", "signals": signals},
    ]  # fmt: skip
    try:
        page.goto(f"{server.url}/admin?token={ADMIN_TOKEN}")
        rows = page.locator("#autoscale-history tr.decision")
        page.wait_for_function(
            "document.querySelectorAll('#autoscale-history tr.decision').length === 2"
        )
        assert page.locator("#autoscale-history").is_visible()
        newest, oldest = rows.nth(0).inner_text(), rows.nth(1).inner_text()
        assert "decode" in newest and "2 → 1" in newest and "calm for 5 periods" in newest
        assert "prefill" in oldest and "1 → 2" in oldest and "queued=3" in oldest
        assert "oldest_wait_s=1.50" in oldest and "ttft_p90_s" not in oldest
    finally:
        admin.autoscale_history = []


def test_dashboard_draws_a_slow_requests_timeline(  # type: ignore[no-untyped-def]
    page, slow_server, backend
) -> None:
    server, keeper = slow_server
    for max_tokens in (3, 30):
        httpx.post(
            f"{server.url}/v1/chat/completions",
            timeout=60,
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={"model": backend.model_name, "max_tokens": max_tokens, "ignore_eos": True,
                  "messages": [{"role": "user", "content": "a slow one"}]},
        ).raise_for_status()  # fmt: skip
    page.goto(f"{server.url}/admin?token={ADMIN_TOKEN}")
    page.wait_for_function("document.querySelectorAll('#slow-rows tr.slow').length >= 2")
    assert page.locator("#slow-rows tr.selected").count() == 1  # the slowest, until one is picked
    page.locator("#slow-rows tr.slow").nth(1).click()
    assert "selected" in (page.locator("#slow-rows tr.slow").nth(1).get_attribute("class") or "")
    timeline = page.locator("#timeline")
    timeline.wait_for()
    chosen = next(r for r in keeper.report()["e2e"][1:2])
    rows = timeline.locator(".span-row")
    assert rows.count() == len(chosen["spans"])
    assert rows.first.get_attribute("data-span") == "baton.request"
    # Bars to scale: the request's bar spans its track; each other bar sits where its span
    # started, as wide as it lasted.
    geometry = rows.evaluate_all(
        """rows => rows.map(r => {
            const track = r.querySelector('.span-track').getBoundingClientRect();
            const bar = r.querySelector('.span-bar').getBoundingClientRect();
            return [(bar.left - track.left) / track.width, bar.width / track.width,
                    r.querySelector('.span-time').textContent];
        })"""
    )
    total = chosen["e2e_s"]
    for (left, width, label), span in zip(geometry, chosen["spans"], strict=True):
        assert abs(left - span["start_s"] / total) < 0.01
        assert abs(width - span["duration_s"] / total) < 0.01 or width * total < 0.01
        assert label.endswith(" ms") or label.endswith(" s")
    page.click("#slow-by-ttft")
    page.wait_for_function("document.getElementById('slow-by-ttft').classList.contains('on')")
