"""`baton profile`: measure one worker's engine on this machine and write a JSON profile.

    baton profile --model models/small --out profile.json            # CPU, 1 thread
    baton profile --model /ckpt --device cuda --dtype bfloat16 --out gpu.json
    baton profile --model /ckpt --device cuda --tp 1 2 --out gpu.json   # gpu_tp1/2.json

`--tp` names the tensor-parallel sizes to profile, one profile each, each with its `tp`
(what `baton plan --profile` keys them by): one size writes `--out` as given, several write
`--out`'s name with `_tp<t>` before its suffix. At TP t > 1 the engine is a real
tensor-parallel one, as a worker serves it: t rank processes, each an engine over its shard,
stepping in lockstep over torch.distributed (gloo on CPU, NCCL on GPU: engine/tp), timed on
the same shapes as at TP 1, from rank 0's step totals; `--threads` is per rank.

Prefill time against prompt length (with and without a cached prefix) and decode step time
against batch size and context, each fitted to the performance model (core/perf), with the
samples behind the fits. The KV transfer between workers is measured too (a few seconds; `--no-
measure-transfer` skips it): two processes with caches of the model's KV layout send 1 to 256
blocks (more where a model's blocks are small) over the transport a cluster uses here
(`--transport`: shm for CPU workers on one host, else nixl, else cuda_ipc; both caches where the
engine keeps them), fitted to time = latency + bytes / bandwidth (planner/transfer.py), recorded
as `transfer_gbps`, `transfer_latency_ms`, `transfer_source` ("measured over shm on <host>") and
`samples.transfer`. The rate between hosts is not something one machine can measure: give it
(`--transfer-gbps`, `--transfer-latency-ms`, from `bench/transfer/kv_transfer.py` run between
two of your hosts) and a given figure overrides the measured one. The prefill fit's keys are
those the router simulator reads (`python -m bench.routing.router_sim --profile`). Run it on
the node type the pool will use, with the threads (`--threads`) or GPU a worker gets there.
At TP t the KV transfer is t rank pairs sending at once, each its rank's heads, as a
worker's ranks do (planner/transfer.py); `kv_bytes_per_token` is the whole worker's.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from core.config import EngineConfig
from core.kv_layout import KVLayout
from engine.config import ModelConfig
from kv_transfer import unavailable_reason
from planner import measure as pp
from planner.transfer import BLOCK_COUNTS, measure_transfer


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder")
    p.add_argument("--out", required=True, help="where the JSON profile goes")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--tp",
        type=int,
        nargs="+",
        default=[1],
        help="tensor-parallel sizes, one profile each (several: OUT_tp<t>.json)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    p.add_argument("--chunk-tokens", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024, 2048])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    p.add_argument("--decode-steps", type=int, default=8, help="steps timed per decode shape")
    p.add_argument("--repeat", type=int, default=2, help="rounds kept (after a warm-up)")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="default: room for the shapes")
    p.add_argument(
        "--measure-transfer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time KV sends between two processes here (a few seconds)",
    )
    p.add_argument(
        "--transport",
        choices=("auto", "shm", "nixl", "ucx", "cuda_ipc"),
        default="auto",
        help="the backend measured; auto: shm for a CPU engine (workers on one host), else "
        "nixl where it is installed, else cuda_ipc (GPU workers on one host)",
    )
    p.add_argument("--transfer-blocks", type=int, nargs="+", default=list(BLOCK_COUNTS))
    p.add_argument("--transfer-gbps", type=float, default=None, help="given: overrides the measure")
    p.add_argument("--transfer-latency-ms", type=float, default=None, help="given: overrides")


def transfer_fields(
    args: argparse.Namespace, layout: KVLayout, model_id: str, device: str
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The profile's transfer keys and the samples behind them. Given figures override the
    measured ones, field by field (between hosts, which one machine cannot measure); with
    both given nothing is measured."""
    given = {
        k: v
        for k, v in (("transfer_gbps", args.transfer_gbps),
                     ("transfer_latency_ms", args.transfer_latency_ms))
        if v is not None
    }  # fmt: skip
    fields: dict[str, Any] = {"transfer_gbps": 0.0, "transfer_latency_ms": 0.0}
    if len(given) == 2 or not args.measure_transfer:
        fields.update(given)
        fields["transfer_source"] = (
            "given (--transfer-gbps / --transfer-latency-ms)"
            if fields["transfer_gbps"]
            else "not measured: 0, no transfer between workers is modelled"
        )
        return fields, []
    backend = args.transport
    if backend == "auto":
        backend = "shm" if device == "cpu" else "nixl"
        if backend == "nixl" and unavailable_reason("nixl"):
            backend = "cuda_ipc"
    try:
        if reason := unavailable_reason(backend):
            raise RuntimeError(f"{backend} unavailable: {reason}")
        measured = measure_transfer(
            layout, model_id, backend, tuple(args.transfer_blocks), device=device
        )
    except (RuntimeError, TimeoutError, ValueError) as e:  # the engine's figures still stand
        print(f"baton profile: the KV transfer was not measured: {e}", file=sys.stderr)
        fields.update(given)
        fields["transfer_source"] = f"not measured ({e}): 0 unless given"
        return fields, []
    fields.update(
        transfer_gbps=round(measured.gbps, 4),
        transfer_latency_ms=round(measured.latency_ms, 4),
    )
    fields.update(given)
    fields.update(
        transfer_source=measured.source + "".join(f"; {k} given" for k in given),
        transfer_block_bytes=measured.block_bytes,
        transfer_max_fit_error=round(measured.max_fit_error, 4),
    )
    return fields, measured.sample_rows()


SHAPE_FLAGS = (
    ("lengths", "the prefill fit separates the cost per token from the attention's"),
    ("batches", "the decode fit separates the cost per step from the cost per row"),
    ("contexts", "the decode fit separates the cost per row from the cost per context token"),
)


def shape_error(args: argparse.Namespace) -> str | None:
    """Why the shapes asked for cannot be fitted (naming the flag), or None: each fit needs
    two different values of the dimension it separates two terms along."""
    for name, why in SHAPE_FLAGS:
        values = getattr(args, name)
        if len(set(values)) < 2:
            return f"--{name} needs at least two different values ({why}); got {values}"
    if min(args.tp) < 1 or len(set(args.tp)) < len(args.tp):
        return f"--tp takes different sizes of at least 1; got {args.tp}"
    return None


def out_paths(out: str, tps: list[int]) -> dict[int, Path]:
    """Where each TP size's profile goes: `out` itself for one size; for several, `out`'s
    name with `_tp<t>` before its suffix (p.json: p_tp1.json, p_tp2.json)."""
    path = Path(out)
    if len(tps) == 1:
        return {tps[0]: path}
    return {tp: path.with_name(f"{path.stem}_tp{tp}{path.suffix or '.json'}") for tp in tps}


def check_gpus(device: str, tp: int) -> None:
    """Refuse a TP size this node has too few GPUs for (one a rank, GPUs 0 .. tp-1)."""
    if device == "cpu":
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < tp:
        raise ValueError(f"tp {tp} needs {tp} GPUs; {torch.cuda.device_count()} visible here")


def engine_config(args: argparse.Namespace, tp: int) -> EngineConfig:
    """Room for the largest decode shape without preempting: each row's context and every
    token it asks for, and a few spare (per rank: each holds every block, its heads' share)."""
    batch, context = max(args.batches), max(args.contexts)
    asked = pp.decode_max_tokens(batch, context, args.chunk_tokens, args.decode_steps)
    tokens_per_row = context + asked + 4
    kv_tokens = max(batch * tokens_per_row, 2 * max(args.lengths) + 64)
    return EngineConfig(
        device=args.device,
        dtype=args.dtype,
        num_threads=args.threads if args.device == "cpu" else None,
        max_num_batched_tokens=args.chunk_tokens,
        max_num_seqs=max(args.batches),
        num_kv_blocks=None if args.kv_cache_gb else -(-kv_tokens // 16) + 16,  # 16-token blocks
        kv_cache_memory_bytes=int(args.kv_cache_gb * (1 << 30)) if args.kv_cache_gb else None,
        tp_size=tp,
    )


def measure_tp(args: argparse.Namespace, model_dir: Path, tp: int) -> dict[str, Any]:
    """One TP size's profile: its engine measured (then shut down), then the transfer.
    Raises ValueError where the prefill fit has no per-token cost (profile_prefill)."""
    from core.perf.fit import fit_decode
    from engine.device import resolve_device
    from engine.engine import LLMEngine
    from engine.tp import TPEngine

    config = engine_config(args, tp)
    device = resolve_device(args.device).type
    started = time.perf_counter()
    engine = (
        LLMEngine(model_dir, config, worker_id="profile")
        if tp == 1
        else TPEngine(model_dir, config, worker_id="profile")
    )
    rng = random.Random(0)
    try:
        prefill, prefill_fit = pp.profile_prefill(engine, args.lengths, args.repeat, rng)
        decode = pp.measure_decode(engine, args.batches, args.contexts, args.decode_steps, rng)
        rank_layout = engine.kv_layout()
    finally:
        if isinstance(engine, TPEngine):
            engine.shutdown()
        del engine  # its memory and cores back before the transfer is timed
    mc = ModelConfig.from_dir(model_dir)
    transfer, transfer_samples = transfer_fields(args, rank_layout, mc.model_id, device)
    ranks = f", {tp} rank processes over {'gloo' if device == 'cpu' else 'nccl'}"
    return {
        "source": (
            f"baton profile: {Path(args.model).name}, {mc.dtype} on {device}, "
            f"tp {tp}{ranks if tp > 1 else ''}, {args.threads} thread(s) per rank, "
            f"{platform.machine()} {platform.processor() or ''}".strip()
        ),
        "tp": tp,
        "chunk_tokens": args.chunk_tokens,
        **{k: round(v, 6) for k, v in prefill_fit.items()},
        "decode": {k: round(v, 6) for k, v in fit_decode(decode).items()},
        # Every rank's heads: what the worker holds and moves per token.
        "kv_bytes_per_token": rank_layout.block_bytes_all_layers * tp // config.block_size,
        # transfer_gbps 0: not measured (the plan then moves no KV between workers).
        **transfer,
        "samples": {
            "prefill": [
                {"steps": s, "tokens": n, "cached": c, "ms": round(t * 1000, 3)}
                for (s, n, c), t in ((x.shape, x.seconds) for x in prefill)
            ],
            "decode": [
                {"batch": b, "context": L, "step_ms": round(t * 1000, 3)}
                for (b, L), t in ((x.shape, x.seconds) for x in decode)
            ],
            "transfer": transfer_samples,
        },
        "measured_s": round(time.perf_counter() - started, 1),
    }


def run_profile(args: argparse.Namespace) -> int:
    from engine.gguf import resolve_model
    from engine.tp import check_tp_size

    if error := shape_error(args):
        print(f"baton profile: {error}", file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model)
    try:  # every size checked before the first is measured (minutes)
        for tp in args.tp:
            check_tp_size(ModelConfig.from_dir(model_dir), tp)
        check_gpus(args.device, max(args.tp))
    except ValueError as e:
        print(f"baton profile: --tp: {e}", file=sys.stderr)
        return 2
    paths = out_paths(args.out, args.tp)
    for tp, out in paths.items():
        try:
            profile = measure_tp(args, model_dir, tp)
        except ValueError as e:
            print(f"baton profile: tp {tp}: {e}", file=sys.stderr)
            return 1
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(profile, indent=1) + "\n")
        print(json.dumps({k: v for k, v in profile.items() if k != "samples"}, indent=1))
        print(f"baton profile: tp {tp} written to {out}", file=sys.stderr)
    if len(paths) > 1:
        print("profiles: " + " ".join(str(p) for p in paths.values()))
    return 0


def register_command(sub: argparse._SubParsersAction) -> None:
    """`baton profile`: registered through the `baton.commands` entry point (pyproject.toml)."""
    p = sub.add_parser("profile", help="measure a worker's engine here; a JSON profile")
    add_profile_arguments(p)
    p.set_defaults(func=run_profile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton profile", description=__doc__)
    add_profile_arguments(parser)
    return run_profile(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
