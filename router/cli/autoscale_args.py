"""The autoscaler's flags of `baton serve` (router/cluster/autoscale); off unless
`--autoscale`."""

from __future__ import annotations

import argparse

from router.cluster.autoscale.policy import AutoscaleConfig


def add_autoscale_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("autoscaling (off unless --autoscale)")
    g.add_argument(
        "--autoscale",
        action="store_true",
        help="size the prefill and decode pools to the TTFT / ITL targets while serving "
        "(scale-down drains workers: no request is lost)",
    )
    g.add_argument("--ttft-slo", type=float, default=2.0, metavar="S", help="TTFT target (p90)")
    g.add_argument(
        "--itl-slo", type=float, default=0.2, metavar="S", help="inter-token latency target (p90)"
    )
    for pool, low, high in (("prefill", 0, 8), ("decode", 1, 8)):
        g.add_argument(f"--min-{pool}", type=int, default=low, help=f"smallest {pool} pool")
        g.add_argument(f"--max-{pool}", type=int, default=high, help=f"largest {pool} pool")
    g.add_argument(
        "--autoscale-interval", type=float, default=2.0, metavar="S", help="seconds between looks"
    )
    g.add_argument(
        "--scale-up-cooldown", type=float, default=10.0, metavar="S",
        help="seconds after a pool changed before it grows again",
    )  # fmt: skip
    g.add_argument(
        "--scale-down-cooldown", type=float, default=60.0, metavar="S",
        help="seconds after a pool changed before it shrinks",
    )  # fmt: skip
    g.add_argument(
        "--scale-up-lead", type=float, default=10.0, metavar="S",
        help="how long a new worker takes to serve: a decode pool whose running batch would "
        "fill within it grows now",
    )  # fmt: skip
    g.add_argument(
        "--scale-down-headroom", type=float, default=0.75, metavar="F",
        help="shrink only if one worker fewer would run at most this share of the capacity "
        "per worker the pool showed while saturated",
    )  # fmt: skip


def autoscale_config(args: argparse.Namespace) -> AutoscaleConfig | None:
    if not args.autoscale:
        return None
    try:
        return AutoscaleConfig(
            ttft_slo_s=args.ttft_slo,
            itl_slo_s=args.itl_slo,
            min_sizes={"prefill": args.min_prefill, "decode": args.min_decode},
            max_sizes={"prefill": args.max_prefill, "decode": args.max_decode},
            interval_s=args.autoscale_interval,
            up_cooldown_s=args.scale_up_cooldown,
            down_cooldown_s=args.scale_down_cooldown,
            lead_s=args.scale_up_lead,
            down_headroom=args.scale_down_headroom,
        )
    except ValueError as e:
        raise SystemExit(f"baton serve: {e}") from None
