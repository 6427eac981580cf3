"""Where the benchmarks write: `bench/results/<subject>/<what it measures>.json`, one file per
measurement, replaced by the next run of the same command.

The cluster simulator's default worker profile (the routing benchmarks replay traces timed
by it) is `bench/results/planning/profiles/cpu_small.json`, measured with `baton profile` on
this project's build machine (its `source` field says how). The profile's model and reader
are core/perf. Absolute times scale with the hardware, so the simulator replays a trace at a
chosen pool load (`python -m bench.routing.router_sim --load`) rather than at the trace's own
clock: the hit rates do not depend on the profile, the queueing does.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SUBJECTS = ("engine", "transfer", "routing", "serving", "planning", "chaos", "observability")
PROFILES = RESULTS / "planning" / "profiles"
DEFAULT_PROFILE = PROFILES / "cpu_small.json"


def results_file(subject: str, name: str) -> Path:
    """The file a benchmark of `subject` writes its measurement `name` to."""
    if subject not in SUBJECTS:
        raise ValueError(f"unknown subject {subject!r}; one of {', '.join(SUBJECTS)}")
    return RESULTS / subject / name
