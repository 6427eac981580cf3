"""The autoscale group: sizing the prefill and decode pools to latency targets while serving
(router/cluster/autoscale's AutoscaleConfig); off unless --autoscale."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from router.cli.config.knob import default_of, knob
from router.cluster.autoscale.policy import AutoscaleConfig

_MIN = default_of(AutoscaleConfig, "min_sizes")
_MAX = default_of(AutoscaleConfig, "max_sizes")


@dataclass(frozen=True)
class AutoscaleOptions:
    TITLE: ClassVar[str] = "autoscale"
    ABOUT: ClassVar[str] = "pool sizes that follow the TTFT / ITL targets; off unless --autoscale"

    autoscale: bool = knob(
        False,
        "size the prefill and decode pools to the TTFT / ITL targets while serving (scale-down "
        "drains workers: no request is lost)",
    )
    ttft_slo: float = knob(
        default_of(AutoscaleConfig, "ttft_slo_s"), "TTFT target (p90), seconds", metavar="S"
    )
    itl_slo: float = knob(
        default_of(AutoscaleConfig, "itl_slo_s"),
        "inter-token latency target (p90), seconds",
        metavar="S",
    )
    min_prefill: int = knob(_MIN["prefill"], "smallest prefill pool", metavar="N")
    max_prefill: int = knob(_MAX["prefill"], "largest prefill pool", metavar="N")
    min_decode: int = knob(_MIN["decode"], "smallest decode pool", metavar="N")
    max_decode: int = knob(_MAX["decode"], "largest decode pool", metavar="N")
    autoscale_interval: float = knob(
        default_of(AutoscaleConfig, "interval_s"),
        "seconds between evaluations of the pools",
        metavar="S",
    )
    scale_up_cooldown: float = knob(
        default_of(AutoscaleConfig, "up_cooldown_s"),
        "seconds after a pool changed before it grows again",
        metavar="S",
    )
    scale_down_cooldown: float = knob(
        default_of(AutoscaleConfig, "down_cooldown_s"),
        "seconds after a pool changed before it shrinks",
        metavar="S",
    )
    scale_up_lead: float = knob(
        default_of(AutoscaleConfig, "lead_s"),
        "how long a new worker takes to serve: a decode pool whose running batch would fill "
        "within it grows now",
        metavar="S",
    )
    scale_down_headroom: float = knob(
        default_of(AutoscaleConfig, "down_headroom"),
        "shrink only if one worker fewer would run at most this share of the capacity per "
        "worker the pool showed while saturated",
        metavar="F",
    )

    def autoscale_config(self) -> AutoscaleConfig | None:
        """The autoscaler's settings; None when --autoscale is off. Raises ValueError on
        targets or sizes it refuses."""
        if not self.autoscale:
            return None
        return AutoscaleConfig(
            ttft_slo_s=self.ttft_slo,
            itl_slo_s=self.itl_slo,
            min_sizes={"prefill": self.min_prefill, "decode": self.min_decode},
            max_sizes={"prefill": self.max_prefill, "decode": self.max_decode},
            interval_s=self.autoscale_interval,
            up_cooldown_s=self.scale_up_cooldown,
            down_cooldown_s=self.scale_down_cooldown,
            lead_s=self.scale_up_lead,
            down_headroom=self.scale_down_headroom,
        )
