"""Where the cluster simulator's default worker profile lives: `bench/profiles/cpu_small.json`,
measured with `baton profile` on this project's build machine (its `source` field says how).
The profile's model and reader are core/perf. Absolute times scale with the hardware, so the
simulator replays a trace at a chosen pool load (bench.router_sim --load) rather than at the
trace's own clock: the hit rates do not depend on the profile, the queueing does.
"""

from __future__ import annotations

from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = PROFILES / "cpu_small.json"
