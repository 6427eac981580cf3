"""`baton serve`'s whole configuration: one typed record per group, read from the parsed
command line, checked in one place, and turned into the records the cluster runs on.

    ServeConfig.from_args(namespace)   each knob's value from its flag (or, where the flag is
                                       not given, its environment variable), then check()
    check()                            minimums, the knobs of one routing policy, the knobs
                                       that go in pairs; ConfigError names the flag
    engine_config(), cluster_spec()    EngineConfig and ClusterSpec for the controller
    routing.router_config()            RouterConfig;  limits.door_limits(): DoorLimits
    autoscale.autoscale_config()       AutoscaleConfig, or None
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from core.config import EngineConfig
from router.cli.config.autoscale import AutoscaleOptions
from router.cli.config.cluster import ClusterOptions, PoolLayout
from router.cli.config.engine import EngineOptions
from router.cli.config.frontdoor import FrontDoorOptions
from router.cli.config.knob import Setting, settings
from router.cli.config.limits import LimitOptions
from router.cli.config.model import ModelOptions
from router.cli.config.observability import ObservabilityOptions
from router.cli.config.routing import RoutingOptions
from router.cli.config.transfer import TransferOptions
from router.cluster.spec import ClusterSpec

_GIB = 1 << 30


class ConfigError(ValueError):
    """A command line `baton serve` refuses; the message names the flag."""


@dataclass(frozen=True)
class ServeConfig:
    """The groups, in the order `baton serve --help` and docs/configuration.md show them."""

    model: ModelOptions = dataclasses.field(default_factory=ModelOptions)
    engine: EngineOptions = dataclasses.field(default_factory=EngineOptions)
    cluster: ClusterOptions = dataclasses.field(default_factory=ClusterOptions)
    routing: RoutingOptions = dataclasses.field(default_factory=RoutingOptions)
    front_door: FrontDoorOptions = dataclasses.field(default_factory=FrontDoorOptions)
    limits: LimitOptions = dataclasses.field(default_factory=LimitOptions)
    autoscale: AutoscaleOptions = dataclasses.field(default_factory=AutoscaleOptions)
    transfer: TransferOptions = dataclasses.field(default_factory=TransferOptions)
    observability: ObservabilityOptions = dataclasses.field(default_factory=ObservabilityOptions)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        """The configuration a parsed `baton serve` command line asks for, checked."""
        groups = {}
        for name, group in group_types().items():
            values = {}
            for setting in settings(group):
                value = getattr(args, setting.name, setting.default)
                if value is None and setting.knob.env is not None:
                    value = setting.knob.env.get()
                values[setting.name] = value
            groups[name] = group(**values)
        config = cls(**groups)
        config.check()
        return config

    def knobs(self) -> Iterator[tuple[Setting, Any]]:
        """Every knob with its value here."""
        for name in group_types():
            group = getattr(self, name)
            for setting in settings(type(group)):
                yield setting, getattr(group, setting.name)

    def check(self) -> None:
        """Raise ConfigError for the first thing wrong: a value under its minimum, a knob of
        one routing policy set with another, knobs that go together given apart, autoscale
        targets or sizes the autoscaler refuses."""
        given: list[tuple[Setting, Any]] = []
        for setting, value in self.knobs():
            low = setting.knob.minimum
            if low is not None and value is not None and value < low:
                raise ConfigError(f"{setting.flag} must be >= {low:g}")
            if value != setting.default:
                given.append((setting, value))
        for setting, _ in given:
            policy = setting.knob.policy
            if policy is not None and policy != self.routing.policy:
                flags = [s.spelled(v) for s, v in given if s.knob.policy == policy]
                raise ConfigError(f"{' and '.join(flags)} needs --policy {policy}")
        if (self.engine.speculative == "draft") != (self.engine.speculative_model is not None):
            raise ConfigError("--speculative-model goes with --speculative draft")
        if self.observability.otlp_traces_sample_ratio > 1:
            raise ConfigError("--otlp-traces-sample-ratio must be <= 1")
        layouts = self.cluster.prefill_layout or self.cluster.decode_layout
        if layouts and self.cluster.mode == "unified":
            raise ConfigError("--prefill-layout and --decode-layout need --mode disaggregated")
        if self.cluster.attach and not self.cluster.address:
            raise ConfigError("--attach serves a running cluster: give its --address")
        cluster = self.cluster
        if not 0 < cluster.gpus_per_worker <= 1:
            raise ConfigError("--gpus-per-worker must be in (0, 1]")
        layouts = (cluster.prefill_layout, cluster.decode_layout)
        tps = [cluster.tp, *(layout.tp for layout in layouts if layout and layout.tp)]
        if cluster.gpus_per_worker < 1 and max(tps) > 1:
            raise ConfigError("--gpus-per-worker below 1 needs TP 1 (TP ranks take whole GPUs)")
        try:
            self.autoscale.autoscale_config()
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def engine_config(self, speculative_model: str | None = None) -> EngineConfig:
        """Every worker's engine settings; `speculative_model` is the draft checkpoint's
        folder as resolved here (--speculative-model as given when None). The TP size is the
        cluster's (ClusterSpec.tp): each worker sets its engine's from its own spec."""
        model, engine = self.model, self.engine
        return EngineConfig(
            kv_cache_memory_bytes=None
            if engine.kv_cache_gb is None
            else int(engine.kv_cache_gb * _GIB),
            kv_offload_host_bytes=int(engine.kv_offload_host_gb * _GIB),
            kv_offload_disk_bytes=int(engine.kv_offload_disk_gb * _GIB),
            kv_offload_dir=engine.kv_offload_dir,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            dtype=model.dtype,
            quantization=model.quantization,
            kv_cache_dtype=model.kv_cache_dtype,
            speculative=engine.speculative,
            speculative_model=speculative_model or engine.speculative_model,
            num_speculative_tokens=engine.num_speculative_tokens,
            cuda_graphs=engine.cuda_graphs,
            overlap_steps=None if engine.overlap_steps else False,
            fair_share=self.limits.fair_share_config(),
            max_loras=model.loras(),
            max_lora_rank=model.max_lora_rank,
        )

    def cluster_spec(
        self, model_dir: str, device: str, speculative_model: str | None = None
    ) -> ClusterSpec:
        """What the controller brings up: `model_dir` and `device` as resolved here (the
        checkpoint folder; cpu or cuda)."""
        cluster = self.cluster
        unified = cluster.mode == "unified"
        engine = self.engine_config(speculative_model)
        prefill = cluster.prefill_layout or PoolLayout()
        decode = cluster.decode_layout or PoolLayout()
        return ClusterSpec(
            model_dir=model_dir,
            mode=cluster.mode,
            num_prefill=0 if unified else cluster.prefill,
            num_decode=cluster.prefill + cluster.decode if unified else cluster.decode,
            engine=engine,
            prefill_engine=prefill.engine(engine),
            decode_engine=decode.engine(engine),
            prefill_tp=prefill.tp,
            decode_tp=decode.tp,
            transport=self.transfer.transport,
            num_threads=self.engine.threads,
            engine_nice=self.engine.engine_nice,
            cpu_bind=self.engine.cpu_bind,
            tp=cluster.tp,
            device=device,
            gpus_per_worker=cluster.gpus_per_worker,
            worker_start_timeout_s=cluster.worker_start_timeout,
            redis_url=cluster.redis,
            local=cluster.address is None,
            autoscale=self.autoscale.autoscale_config(),
            tracing=self.observability.tracing_config(),
        )


def group_types() -> dict[str, type]:
    """Field name -> group record, in ServeConfig's order."""
    return {f.name: f.default_factory for f in dataclasses.fields(ServeConfig)}  # type: ignore[misc]
