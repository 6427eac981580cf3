"""The device check: one prepared run on a GPU, at most 8 minutes, every figure written to
JSON as soon as it is measured (a run cut short keeps what it had), a table at the end.

    python -m bench.device.check --dry-run --out /tmp/dry.json  # on CPU: tiny model and shapes
    python -m bench.device.check [--out DIR/device_check.json] [--budget-s 480]  # the GPU

On the GPU host nothing installs: the engine's and `baton serve`'s missing packages travel
as wheels that `python -m bench.device.wheels` fetches here into .whl/ (carried), and the
command there is

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && \
        python3 -m bench.device.check

Sections, in this order, each skipped (with why) when the time left is under its estimate:

    hardware    a device-to-device copy's GB/s and a bf16 matmul's TFLOP/s: the floors' rates
    kernels     the attention kernels' launches tuned, prefill at head_dims 128 / 64 / 256
                and decode at 128, in at most ~2 minutes (the device's table,
                engine/kernels/tuned.py: the later sections launch what it chose;
                bench/device/tuning.py), then Triton prefill attention against every SDPA
                backend at 1 x 4,096 and 8 x 1,024
    checkpoint  a random Llama-3.1-8B-shaped checkpoint, drawn on the device, bf16
    engine      decode at batch 1 and 64 x 2,048 context, 2,048- / 256- / 128-token prefills,
                each beside its floor, the decodes and the long prefill kernel by kernel;
                offline 1 x 128 -> 128 and 64 x 512 -> 128
    peer        transformers on the same checkpoint in a subprocess: eager, static cache,
                static cache + torch.compile while the budget lasts
    served      `baton serve` unified and 1P+1D sharing the GPU (--gpus-per-worker 0.5),
                `baton bench` fixed 256 -> 64 at three rates (needs Ray on the host)
    plan        `baton profile` on the device, and `baton plan`'s prediction of the served
                1P+1D runs beside them (bench/device/planned.py)
    gpu_suite   tests/gpu (pytest -m gpu) in a subprocess: last, as nothing reads its result

A lease is 15 minutes of device time, its start included, and a call at most 10; the
sections' estimates add up to ~18 minutes, so the check takes two leases (two sessions lent
a device). Each call runs what fits in --budget-s (a section is skipped when less is left
than its estimate); --resume keeps what an earlier call finished: on the same warm machine
from the work folder, on a later lease from the report an earlier lease committed
(--resume-from; a checkpoint is made again where its files are gone):

    lease 1, call 1 (timeout 600):  python3 -m bench.device.check
                                    hardware, kernels (checkpoint beside), engine, peer
    lease 1, call 2:                python3 -m bench.device.check --resume --budget-s <left>
                                    the rest as far as it lasts (served needs ~300 s; the
                                    plan none without it; then the GPU suite)
    lease 2, call 1 (timeout 600):  python3 -m bench.device.check --budget-s 540 \
                                        --resume-from bench/results/device/<lease 1>.json
                                    checkpoint, served (1P+1D first), plan

The checkpoint (16 GB to write) is drawn and written in a thread while the kernels are
tuned, so the engine section is the first to wait for it.

The dry run takes the same code paths on the CPU with the tiny model (Triton under its
interpreter), so the CPU suite knows the script works before it meets a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.device import figures, hf_peer, targets
from bench.device import tuning as tuned_launches

LAST_CALL = "last_check.json"
"""The latest call's report in the work folder: what --resume keeps."""


@dataclass
class Run:
    """The JSON the check writes, rewritten after every section."""

    out: Path
    dry_run: bool
    budget_s: float
    work: Path
    """Where the checkpoint and the servers' charts go (not beside `out`: on the device
    every file there is copied back)."""
    start: float = field(default_factory=time.monotonic)
    report: dict[str, Any] = field(default_factory=dict)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def save(self) -> None:
        """The report, to `out` and (for a later call's --resume) to the work folder."""
        text = json.dumps(self.report, indent=2, default=str)
        for path in (self.out, self.work / LAST_CALL):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)


@dataclass(frozen=True)
class Section:
    name: str
    estimate_s: float
    """Device seconds it is expected to take (skipped when less is left)."""
    run: Callable[[Run], dict[str, Any]]
    beside: str | None = None
    """The section this one runs beside, in a thread started with it: work that keeps the
    device idle (the checkpoint's 16 GB go to disk) waits for none; its own place in the
    order is where it is waited for."""


def _device(run: Run) -> torch.device:
    return torch.device("cpu" if run.dry_run else "cuda")


def hardware(run: Run) -> dict[str, Any]:
    return figures.hardware_rates(_device(run), small=run.dry_run)


def kernels(run: Run) -> dict[str, Any]:
    tuning = tuned_launches.tune_kernels(_device(run), run.dry_run, run.work, run.out.parent)
    against = figures.prefill_attention_against_sdpa(_device(run), small=run.dry_run)
    return {**against, "tuning": tuning, "headline": {**against["headline"],
                                                      **tuning["headline"]}}  # fmt: skip


def checkpoint(run: Run) -> dict[str, Any]:
    folder = run.work / "checkpoint"
    return figures.make_checkpoint(folder, _device(run), small=run.dry_run)


def _checkpoint(run: Run) -> Path:
    """The checkpoint its section made this run."""
    made = run.report["sections"].get("checkpoint", {})
    if "path" not in made:
        raise RuntimeError("no checkpoint (its section did not finish)")
    return Path(made["path"])


def engine(run: Run) -> dict[str, Any]:
    from bench.device import engine_steps

    rates, device = run.report["sections"].get("hardware", {}), _device(run)
    try:
        return engine_steps.measure(_checkpoint(run), device, rates, run.dry_run)
    finally:  # the engine is gone: its memory goes back before the next section's
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def gpu_suite(run: Run) -> dict[str, Any]:
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu"]
    if run.dry_run:
        args.append("--collect-only")  # no GPU to run them on: that they collect
    timeout = max(30.0, run.left_s() - 30)
    done = subprocess.run(
        [*args, "tests/gpu"], capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {
        "returncode": done.returncode,
        "summary": lines[-1] if lines else "",
        "tail": lines[-15:],
    }


def peer(run: Run) -> dict[str, Any]:
    out = run.work / "peer.json"
    out.unlink(missing_ok=True)
    args = [sys.executable, "-m", "bench.device.hf_peer", str(_checkpoint(run)), "--out", str(out)]
    if run.dry_run:
        args.append("--dry-run")
    # At most 5 minutes: its compile is unbounded, and the later sections need the time.
    timeout = max(30.0, min(run.left_s() - 20, 300.0))
    returncode: int | None = None
    with contextlib.suppress(subprocess.TimeoutExpired):  # what it wrote so far stands
        returncode = subprocess.run(args, timeout=timeout, check=False).returncode
    result = json.loads(out.read_text()) if out.exists() else {}
    runs = {k: v for k, v in result.items() if isinstance(v, dict)}
    rates = {k: v.get("tokens_s") for k, v in runs.items()}
    report = {**result, "timed_out": returncode is None, "returncode": returncode,
              "headline": {f"{k}_tok_s": v for k, v in rates.items()}}  # fmt: skip
    missing = [k for k in hf_peer.RUNS if k not in runs or "error" in runs[k]]
    if missing and not run.dry_run:  # a later call's --resume runs it again
        report["error"] = f"no figure for {', '.join(missing)} (exit {returncode})"
    return report


def served(run: Run) -> dict[str, Any]:
    from bench.device import served as serving

    return serving.served_figures(
        _checkpoint(run), run.out.parent, run.work, run.dry_run, run.left_s
    )


def plan(run: Run) -> dict[str, Any]:
    from bench.device import planned

    served_result = run.report["sections"].get("served", {})
    return planned.plan_against_served(
        _checkpoint(run), served_result, run.work, run.dry_run, run.left_s
    )


SECTIONS = [
    Section("hardware", 10, hardware),
    Section("kernels", 150, kernels),
    Section("checkpoint", 60, checkpoint, beside="kernels"),
    Section("engine", 120, engine),
    Section("peer", 180, peer),
    Section("served", 300, served),
    Section("plan", 150, plan),
    Section("gpu_suite", 120, gpu_suite),
]


def describe_host(dry_run: bool) -> dict[str, Any]:
    host = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dry_run": dry_run,
    }
    if torch.cuda.is_available() and not dry_run:
        host["device"] = torch.cuda.get_device_name(0)
        host["device_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    else:
        host["device"] = platform.processor() or platform.machine()
    try:
        import triton

        host["triton"] = triton.__version__
    except ImportError:
        host["triton"] = None
    return host


def finished_earlier(report: Path, device: str) -> dict[str, dict[str, Any]]:
    """The sections an earlier call's `report` finished (not failed, skipped or done in
    part) on this `device`: the last call's in the work folder, or one a lease before
    committed. A checkpoint whose files are gone (another machine) is made again; a report
    from another kind of device keeps nothing (its figures are not this one's)."""
    if not report.exists():
        return {}
    earlier = json.loads(report.read_text())
    host = earlier.get("host", {})
    if host.get("device") != device:
        print(f"{report} was measured on {host.get('device')}, not {device}: nothing kept")
        return {}
    return {
        name: {**result, "kept_from": result.get("kept_from", host.get("date"))}
        for name, result in earlier.get("sections", {}).items()
        if not result.keys() & {"error", "skipped", "partial"}
        and (name != "checkpoint" or Path(result.get("path", "")).exists())
    }


def check(
    out: Path,
    dry_run: bool,
    budget_s: float,
    only: list[str] | None = None,
    work: Path | None = None,
    resume: bool = False,
    resume_from: Path | None = None,
) -> Run:
    """Run the sections (`only` these, if given; with `resume`, not those the last call in
    `work` finished, or `resume_from`'s report, whose results it keeps)."""
    run = Run(out, dry_run, budget_s, work or out.parent / "work")
    host = describe_host(dry_run)
    kept = {}
    if resume or resume_from is not None:
        kept = finished_earlier(resume_from or run.work / LAST_CALL, host["device"])
    if not dry_run:  # the kernel table the kept tuning chose: this machine's, or committed
        for folder in (run.work, *([resume_from.parent] if resume_from else [])):
            tuned_launches.name_earlier_table(folder)
    run.report = {"host": host, "budget_s": budget_s, "sections": {}}
    run.save()
    chosen = [s for s in SECTIONS if not only or s.name in only]
    started: dict[str, Future[dict[str, Any]]] = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        for section in chosen:
            if section.name in kept:
                run.report["sections"][section.name] = kept[section.name]
                run.save()
                continue
            section_starts = run.left_s() >= section.estimate_s
            for other in chosen:
                if other.beside == section.name and other.name not in kept and section_starts:
                    started[other.name] = pool.submit(other.run, run)
            result = _run_section(run, section, started.pop(section.name, None))
            run.report["sections"][section.name] = result
            run.save()
            _free_device_memory(run)
    run.report["total_s"] = round(time.monotonic() - run.start, 1)
    run.report["targets"] = targets.evaluate(run.report)
    run.save()
    print(figures.table(run.report))
    return run


def _free_device_memory(run: Run) -> None:
    """What a section left (a failed one's traceback held its engine) goes back before the
    next section's servers size their caches from the free memory."""
    gc.collect()
    if not run.dry_run:
        torch.cuda.empty_cache()


def _run_section(
    run: Run, section: Section, started: Future[dict[str, Any]] | None
) -> dict[str, Any]:
    """The section's result, or why it has none; `started`: it runs already, beside another."""
    begun = time.monotonic()
    if started is None and run.left_s() < section.estimate_s:
        result: dict[str, Any] = {
            "skipped": f"{run.left_s():.0f} s left, needs ~{section.estimate_s:.0f}"
        }
    else:
        print(f"[{time.monotonic() - run.start:6.1f} s] {section.name}", flush=True)
        try:
            if started is None:
                result = section.run(run)
            else:
                result = started.result(timeout=max(1.0, run.left_s()))
                result["beside"] = section.beside
        except Exception as e:  # a section's failure is a finding, not the end
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    result["took_s"] = round(time.monotonic() - begun, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "device_check.json"
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model and shapes")
    parser.add_argument(
        "--budget-s", type=float, default=480.0, help="stop starting sections past this"
    )
    parser.add_argument("--only", nargs="+", default=None, choices=[s.name for s in SECTIONS])
    parser.add_argument("--resume", action="store_true",
                        help="keep the last call's finished sections (in --work)")  # fmt: skip
    parser.add_argument("--resume-from", type=Path, default=None, metavar="REPORT",
                        help="keep the finished sections of this earlier report")  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path("/tmp/baton-device-check"),
                        help="the checkpoint (16 GB on the device) and charts")  # fmt: skip
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print("bench.device.check: no CUDA device; --dry-run runs it on the CPU")
        return 2
    run = check(args.out, args.dry_run, args.budget_s, args.only, args.work, args.resume,
                args.resume_from)  # fmt: skip
    failed = [n for n, r in run.report["sections"].items() if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
