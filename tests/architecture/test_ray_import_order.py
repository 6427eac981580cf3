"""Ray must not be imported before `init_ray` has set its environment: imported earlier, a
local cluster listens on every interface instead of loopback (tests/cluster/
test_local_listeners.py catches that end to end, slowly). This checks it in a second: what
`baton serve` imports before it starts Ray leaves Ray unimported."""

from __future__ import annotations

import subprocess
import sys

# router.cli.serve._serve's imports, which run before its init_ray call.
BEFORE_INIT_RAY = (
    "router.cli.serve",
    "router.cluster.admin",
    "router.cluster.bringup",
    "router.cluster.membership",
    "router.frontdoor.grpc.server",
    "router.frontdoor.http.app",
    "router.frontdoor.metrics",
    "router.routing.route",
)


def test_serving_imports_do_not_import_ray() -> None:
    code = "\n".join(f"import {m}" for m in BEFORE_INIT_RAY)
    code += "\nimport sys\nassert 'ray' not in sys.modules, 'imported ray'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
