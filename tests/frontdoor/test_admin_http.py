"""Admin JSON endpoints: token required, state, scale and drain through the in-process
admin (real engines)."""

from __future__ import annotations

import httpx
import pytest

from tests.frontdoor.conftest import ADMIN_TOKEN
from tests.support.http_server import HTTPServerThread
from tests.support.in_process_admin import InProcessAdmin

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.mark.parametrize(
    "path",
    [
        "/admin",
        "/admin/api/state",
        "/admin/api/stats",
        "/admin/api/slow-requests",
        "/admin/static/admin.js",
        "/admin/static/slow_requests.js",
    ],
)
def test_admin_needs_the_token(server: HTTPServerThread, path: str) -> None:
    assert httpx.get(f"{server.url}{path}").status_code == 401
    bad = httpx.get(f"{server.url}{path}", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert httpx.get(f"{server.url}{path}", headers=ADMIN).status_code == 200
    r = httpx.post(f"{server.url}/admin/api/pools/decode/scale", json={"size": 0})
    assert r.status_code == 401


def test_page_sets_a_strict_cookie(server: HTTPServerThread) -> None:
    r = httpx.get(f"{server.url}/admin", params={"token": ADMIN_TOKEN})
    assert r.status_code == 200 and "<canvas" in r.text
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    with httpx.Client(base_url=server.url, cookies=r.cookies) as browser:
        assert browser.get("/admin/api/state").status_code == 200
    assert httpx.get(f"{server.url}/admin", params={"token": "wrong"}).status_code == 401


def test_scale_and_drain_a_pool(server: HTTPServerThread, admin: InProcessAdmin) -> None:
    url = f"{server.url}/admin/api"
    before = len(admin.workers("prefill"))
    r = httpx.post(
        f"{url}/pools/prefill/scale", json={"size": before + 1}, headers=ADMIN, timeout=30
    )
    assert r.status_code == 200, r.text
    pool = next(p for p in r.json()["pools"] if p["name"] == "prefill")
    assert pool["desired_size"] == before + 1 and len(pool["workers"]) == before + 1
    assert all(w["state"] == "ready" and w["role"] == "prefill" for w in pool["workers"])
    newest = pool["workers"][-1]["worker_id"]
    r = httpx.post(f"{url}/workers/{newest}/drain", headers=ADMIN, timeout=30)
    assert r.status_code == 200
    states = {w["worker_id"]: w["state"] for p in r.json()["pools"] for w in p["workers"]}
    assert states.get(newest, "dead") in ("draining", "dead")
    assert httpx.post(f"{url}/workers/ghost/drain", headers=ADMIN).status_code == 404
    bad = httpx.post(f"{url}/pools/prefill/scale", json={"size": -1}, headers=ADMIN)
    assert bad.status_code == 400
    bad = httpx.post(f"{url}/pools/nosuch/scale", json={"size": 1}, headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"]["message"]
