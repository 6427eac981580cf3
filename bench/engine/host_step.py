"""The host's part of an engine step: what a GPU waits through unless the steps overlap
(engine/overlap.py). Decode steps at batch 1 and 64 on this CPU, each phase a step:
scheduling, laying the batch out (what is left of the step after the others), the forward
and sampling (the CPU's kernels: on a GPU, the device's work), processing the tokens.

    python -m bench.engine.host_step --out bench/results/engine/host_step_<cpu>.json

The model is the `tiny` preset (the host's work does not depend on the model's size; the
forward here is only what it costs on this CPU). Steps run one at a time (`overlap_steps`
off), timed from the engine's own step totals.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.observability.slow_requests_overhead import cpu_model
from bench.paths import results_file
from core.sampling import SamplingParams
from engine.llm import LLM

MODEL = Path(tempfile.gettempdir()) / "baton-bench-host-step-model"
PHASES = ("schedule_s", "forward_s", "sample_s", "output_s")


def ensure_model() -> Path:
    if not (MODEL / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        make_tiny_model(MODEL, arch="llama", preset="tiny", dtype="bfloat16")
    return MODEL


def measure(llm: LLM, batch: int, prompt_len: int, steps: int) -> dict[str, float]:
    """Per decode step, in µs, once every one of `batch` requests is decoding."""
    engine = llm.engine
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [5 + (i + j) % 900 for j in range(prompt_len)], params)
    while any(not r.output_token_ids for r in engine.requests.values()):
        engine.step()
    totals = engine.step_totals
    before = {p: getattr(totals, p) for p in PHASES}
    first = totals.steps
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - start
    n = totals.steps - first
    out = {p.removesuffix("_s") + "_us": 1e6 * (getattr(totals, p) - before[p]) / n for p in PHASES}
    out["step_us"] = 1e6 * wall / n
    out["layout_us"] = out["step_us"] - sum(out[p.removesuffix("_s") + "_us"] for p in PHASES)
    out["host_us"] = out["schedule_us"] + out["layout_us"] + out["output_us"]
    while engine.has_unfinished():
        engine.step()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3, help="each batch's figure: the median run")
    ap.add_argument("--out", default=str(results_file("engine", "host_step.json")))
    ap.add_argument("--cpu", default=cpu_model(), help="the CPU, as the JSON names it")
    args = ap.parse_args(argv)
    llm = LLM(ensure_model(), dtype="bfloat16", max_num_seqs=64, num_kv_blocks=4096,
              overlap_steps=False)  # fmt: skip
    measure(llm, 4, 64, 8)  # warm-up
    report: dict = {
        "command": "python -m bench.engine.host_step",
        "cpu": args.cpu,
        "date": time.strftime("%Y-%m-%d"),
        "model": "tiny preset, bfloat16",
    }
    for batch, prompt_len in ((1, 128), (64, 192)):
        runs = sorted(
            (measure(llm, batch, prompt_len, args.steps) for _ in range(args.runs)),
            key=lambda r: r["host_us"],
        )
        report[f"decode_b{batch}"] = {**runs[len(runs) // 2], "runs_host_us": [
            r["host_us"] for r in runs]}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("| batch | step µs | schedule | layout | forward | sample | output | host |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in (1, 64):
        r = report[f"decode_b{batch}"]
        cells = [r[k] for k in ("step_us", "schedule_us", "layout_us", "forward_us",
                                "sample_us", "output_us", "host_us")]  # fmt: skip
        print(f"| {batch} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
