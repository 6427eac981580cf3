"""`baton serve` on the device check's one GPU, and `baton bench` against it: 1P+1D sharing
the GPU (`--gpus-per-worker 0.5`), then unified (one worker), each at three rates of the
fixed 256 -> 64 and the long_mix workloads (and, on the 1P+1D server, its request overhead:
what `baton plan` adds to a first token). The low rate's TTFT p50 is held against the
engine's own 256-token prefill step (engine section): what the served path adds to a first
token; then, on a traced server of its own, where that time goes
(bench/planning/ttft_breakdown.py).

The 1P+1D workers' KV moves over NIXL where it is installed, else over CUDA IPC (both caches
on the one GPU: kv_transfer/cuda_ipc_driver.py). Needs Ray and the serving stack on the host;
without them the section says so and skips.
The dry run serves the tiny checkpoint 1P+1D on the CPU at three low rates.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONFIGS = {
    "1p1d": ["--mode", "disaggregated", "--prefill", "1", "--decode", "1",
             "--gpus-per-worker", "0.5"],
    "unified": ["--mode", "unified", "--prefill", "0", "--decode", "1"],
}  # fmt: skip
"""In the order they run: the disaggregated shape first (the plan is held against it)."""
START_S = {"full": 150.0, "dry": 60.0}
"""The least time left to start a server: an 8B checkpoint's load, the KV sizing's forward,
the graphs' capture (two workers at once on the shared GPU) and Ray's start."""
SERVE_FLAGS = {"full": ["--worker-start-timeout", "600"], "dry": []}
"""A worker's first start on a fresh machine compiles the kernels and captures ~40 graphs
beside the other worker sharing the GPU: it may take more than the default 180 s."""
LONG_MIX_S = {"full": 90.0, "dry": 0.0}
"""The least time left to run the long_mix rates after the fixed ones on a server."""
RATES = {"full": ["1", "8", "24"], "dry": ["0.5", "1", "2"]}
WORKLOAD = ["--workload", "fixed", "--input-len", "256", "--output-len", "64"]
WORKLOADS = {"fixed": WORKLOAD, "long_mix": ["--workload", "long_mix"]}
"""fixed 256 -> 64, and long_mix: short chats with 15% prompts 10-50x longer (up to 3,000)."""
LENGTH = {
    "full": {"fixed": ["--duration", "12"], "long_mix": ["--duration", "8"]},
    "dry": {"fixed": ["--num-requests", "3"], "long_mix": ["--num-requests", "3"]},
}
"""How long each rate runs: 12 s (fixed) and 8 s (long_mix) on the device; three requests
in the dry run."""


def device_flags(dry_run: bool) -> list[str]:
    """Where `baton serve` / `baton profile` run the checkpoint: the GPU in bf16, the dry
    run's CPU in float32."""
    if dry_run:
        return ["--device", "cpu", "--dtype", "float32"]
    return ["--device", "cuda", "--dtype", "bfloat16"]


def missing_stack() -> str | None:
    """Why `baton serve` cannot run on this host, or None."""
    for module in ("ray", "fastapi", "uvicorn", "grpc"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed here (baton serve needs the serving stack)"
    return None


def served_figures(
    model_dir: Path, out_dir: Path, work: Path, dry_run: bool, left_s: Callable[[], float]
) -> dict[str, Any]:
    """Servers' logs in `out_dir` (copied back from the device), the benchmark's JSON and
    charts in `work` (their figures are in the result)."""
    from loadgen.server import ServerProcess

    why = missing_stack()
    if why:
        return {"skipped": why}
    kind = "dry" if dry_run else "full"
    device = device_flags(dry_run)
    result: dict[str, Any] = {"rates": [float(r) for r in RATES[kind]], "configs": {}}
    if not dry_run:
        from kv_transfer import unavailable_reason

        result["kv_transport_1p1d"] = "nixl" if unavailable_reason("nixl") is None else "cuda_ipc"
    # The dry run serves 1P+1D only (the configuration with a flag of its own): every line
    # of this runs either way, in half the time.
    configs = {"1p1d": CONFIGS["1p1d"]} if dry_run else CONFIGS
    result["long_mix"] = {}
    for name, flags in configs.items():
        if left_s() < START_S[kind]:
            result["configs"][name] = {"skipped": f"{left_s():.0f} s left"}
            continue
        serve = ["--model", str(model_dir), *device, *SERVE_FLAGS[kind], *flags]
        log = out_dir / f"serve_{name}.log"
        try:
            with ServerProcess(serve, log, start_timeout_s=min(300.0, left_s() - 30)) as server:
                for workload, args in WORKLOADS.items():
                    key = name if workload == "fixed" else f"{name}_{workload}"
                    if workload != "fixed" and left_s() < LONG_MIX_S[kind]:
                        result[workload][name] = {"skipped": f"{left_s():.0f} s left"}
                        continue
                    out = work / f"bench_{key}.json"
                    # `baton bench` by its module: the device runs the tree uninstalled, and
                    # `baton`'s own subcommands beyond serve come from installed entry points.
                    bench = [sys.executable, "-m", "loadgen.cli", "--url", server.url,
                             *args, "--rate", *RATES[kind], *LENGTH[kind][workload],
                             "--drain-timeout", "20", "--no-progress", "--out", str(out),
                             "--plot", str(work / f"bench_{key}.png")]  # fmt: skip
                    run_tool(bench, timeout_s=max(30.0, left_s() - 20))
                    runs = _runs(json.loads(out.read_text())["runs"])
                    if workload == "fixed":
                        result["configs"][name] = runs
                    else:
                        result[workload][name] = runs
                if name == "1p1d":
                    result["request_overhead_1p1d"] = _request_overhead(server.url, dry_run)
        except Exception as e:  # one configuration failing leaves the other
            failed = {"error": f"{type(e).__name__}: {e}"[:1500]}
            result["configs"].setdefault(name, failed)
            result["long_mix"].setdefault(name, failed)
            result["error"] = f"{name}: {failed['error']}"  # a later call's --resume reruns it
    if not dry_run:
        result["breakdown_unified"] = traced_breakdown(model_dir, device, out_dir, left_s)
    parts = [*result["configs"].values(), *result["long_mix"].values()]
    parts.append(result.get("breakdown_unified", {}))
    if any(isinstance(p, dict) and "skipped" in p for p in parts):
        result["partial"] = "a part was skipped for time: a later --resume serves it again"
    return result


def run_tool(args: list[str], timeout_s: float) -> None:
    """Run one of the project's tools; a failure raises with the end of what it printed."""
    done = subprocess.run(args, timeout=timeout_s, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-1200:]
        raise RuntimeError(f"{' '.join(args[1:4])} ... exited {done.returncode}: {tail}")


def _request_overhead(url: str, dry_run: bool) -> dict[str, Any]:
    """What the 1P+1D server adds to a first token beyond its engines' steps, a request at a
    time (bench/planning/request_overhead.py): `baton plan --request-overhead-ms`'s input."""
    from bench.planning import request_overhead

    try:
        return asyncio.run(request_overhead.measure(url, samples=1 if dry_run else 5,
                                                    disagg_tokens=256))  # fmt: skip
    except Exception as e:  # the rates' figures stand without it
        return {"error": f"{type(e).__name__}: {e}"[:400]}


def traced_breakdown(
    model_dir: Path, device: list[str], out_dir: Path, left_s: Callable[[], float]
) -> dict[str, Any]:
    """Where a 256-token prompt's first token goes, unified, on a server of its own that
    exports its traces here (bench/planning/ttft_breakdown.py): not the rate sweep's server,
    whose figures stay free of the exporting."""
    from bench.planning import ttft_breakdown

    if left_s() < START_S["full"]:
        return {"skipped": f"{left_s():.0f} s left"}
    serve = ["--model", str(model_dir), *device, *SERVE_FLAGS["full"], *CONFIGS["unified"]]
    try:
        return ttft_breakdown.serve_and_break_down(
            serve, out_dir / "serve_traced.log", 10, 256, start_timeout_s=min(300.0, left_s() - 30)
        )
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:800]}


def _runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`baton bench`'s runs, a rate each, as the check reports them."""
    return [
        {
            "rate": r["rate"],
            "ok": r["num_ok"],
            "errors": r["num_errors"],
            "ttft_p50_ms": _ms(r["ttft_s"]["p50"]),
            "ttft_p99_ms": _ms(r["ttft_s"]["p99"]),
            "itl_p50_ms": _ms(r["itl_s"]["p50"]),
            "tpot_p50_ms": _ms(r["tpot_s"]["p50"]),
            "output_tokens_s": r["output_tokens_per_s"],
        }
        for r in runs
    ]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds
