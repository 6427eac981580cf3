"""`baton serve`'s configuration (router/cli/config/): one typed field per knob, the parser
generated from them, one default shared with the library records, the checks in one place."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from typing import Any

import pytest

from core.config import EngineConfig
from router.cli.config.autoscale import AutoscaleOptions
from router.cli.config.knob import knob, settings
from router.cli.config.limits import LimitOptions
from router.cli.config.routing import RoutingOptions
from router.cli.config.serve import ConfigError, ServeConfig, group_types
from router.cli.main import build_parser
from router.cluster.autoscale.policy import AutoscaleConfig
from router.cluster.spec import ClusterSpec
from router.frontdoor.limits import DoorLimits
from router.routing.route import RouterConfig

GROUP_TITLES = [
    "model", "engine", "cluster", "routing", "front door", "limits", "autoscale", "transfer",
    "observability",
]  # fmt: skip


def parse(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *flags])


def config(*flags: str) -> ServeConfig:
    return ServeConfig.from_args(parse(*flags))


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baton serve")
    from router.cli.serve_args import add_serve_arguments

    add_serve_arguments(p)
    return p


def test_help_prints_the_flags_in_their_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    headings = [line[:-1] for line in out.splitlines() if line.endswith(":") and line[0] != " "]
    assert headings == ["options", *GROUP_TITLES]
    assert [group.TITLE for group in group_types().values()] == GROUP_TITLES
    section = out.split("\nrouting:\n")[1].split("\nfront door:\n")[0]
    assert "--balance-slack S" in section and "--mode" not in section
    max_num_seqs = out.split("\n  --max-num-seqs N")[1].split("\n  --max-num-batched")[0]
    assert "(default: 128)" in " ".join(max_num_seqs.split())


def test_the_parser_is_the_knobs() -> None:
    """Every flag comes from a knob, and every knob is a flag with the knob's default."""
    actions = {a.dest: a for a in serve_parser()._actions if a.dest != "help"}
    knobs = {s.name: s for s, _ in ServeConfig().knobs()}
    assert set(actions) == set(knobs)
    for name, setting in knobs.items():
        assert actions[name].default == setting.default, name
        assert setting.flag in actions[name].option_strings, name
    assert len(knobs) == 83


def test_no_flags_is_the_default_config() -> None:
    assert config() == ServeConfig()


def test_the_cli_defaults_are_the_librarys() -> None:
    defaults = ServeConfig()
    assert defaults.engine_config() == EngineConfig()
    assert defaults.cluster_spec("/models/m", "cpu") == ClusterSpec(model_dir="/models/m")
    assert defaults.routing.router_config() == RouterConfig()
    assert defaults.limits.door_limits() == DoorLimits()
    assert defaults.autoscale.autoscale_config() is None
    assert AutoscaleOptions(autoscale=True).autoscale_config() == AutoscaleConfig()


def test_the_request_timeout_is_the_front_doors() -> None:
    from router.frontdoor.grpc.server import GRPCServer
    from router.frontdoor.http.app import create_app

    timeout = ServeConfig().front_door.request_timeout
    assert inspect.signature(create_app).parameters["request_timeout_s"].default == timeout
    start = inspect.signature(GRPCServer.start).parameters["request_timeout_s"]
    assert start.default == timeout


def test_one_tp_size() -> None:
    """The cluster's TP size lives in ClusterSpec; the engine record does not repeat it."""
    spec = config("--tp", "2").cluster_spec("/models/m", "cuda")
    assert (spec.tp, spec.engine.tp_size) == (2, EngineConfig().tp_size)
    assert spec.tp_of("prefill") == spec.tp_of("decode") == 2


def test_each_pool_may_have_its_own_layout(capsys: pytest.CaptureFixture[str]) -> None:
    spec = config(
        "--tp", "2", "--prefill-layout", "tp=1,block-size=32", "--decode-layout",
        "kv-cache-dtype=int8",
    ).cluster_spec("/models/m", "cpu")  # fmt: skip
    assert (spec.tp_of("prefill"), spec.tp_of("decode")) == (1, 2)
    prefill, decode = spec.engine_of("prefill"), spec.engine_of("decode")
    assert (prefill.block_size, prefill.kv_cache_dtype) == (32, "auto")
    assert (decode.block_size, decode.kv_cache_dtype) == (16, "int8")
    with pytest.raises(SystemExit):
        config("--decode-layout", "tp=2,heads=4")
    assert "'heads=4': expected KEY=VALUE with KEY one of tp, block-size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config("--prefill-layout", "block-size=24")
    assert "block_size must be a power of two, got 24" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--prefill-layout and --decode-layout need --mode"):
        config("--mode", "unified", "--decode-layout", "tp=2")


def test_unified_mode_puts_every_worker_in_one_pool() -> None:
    spec = config("--mode", "unified", "--prefill", "2", "--decode", "3").cluster_spec("m", "cpu")
    assert (spec.num_prefill, spec.num_decode) == (0, 5)


@pytest.mark.parametrize(
    ("setting", "value"),
    [(s, v) for s, _ in ServeConfig().knobs() if s.knob.minimum is not None for v in [-1]],
    ids=lambda x: getattr(x, "flag", str(x)),
)
def test_a_value_under_its_minimum_names_the_flag(setting: Any, value: int) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(setting.flag)} must be >= "):
        config(setting.flag, str(value))


def test_each_policy_knob_needs_its_policy() -> None:
    policy_knobs = [s for s in settings(RoutingOptions) if s.knob.policy is not None]
    assert {s.flag for s in policy_knobs} == {
        "--prefix-pull-gbps", "--balance-slack", "--balance-measured", "--balance-room"
    }  # fmt: skip
    for setting in policy_knobs:
        flags = (
            [setting.flag] if setting.is_switch() or setting.is_toggle() else [setting.flag, "1"]
        )
        with pytest.raises(ConfigError, match=f"^{re.escape(setting.flag)} needs --policy ttft$"):
            config(*flags)
        assert config("--policy", "ttft", *flags).routing.policy_args() != {}
    with pytest.raises(ConfigError, match=r"^--balance-slack and --no-balance-room needs"):
        config("--balance-slack", "0.1", "--no-balance-room")


def test_pairs_of_knobs_are_checked_with_the_rest() -> None:
    with pytest.raises(ConfigError, match="--speculative-model goes with --speculative draft"):
        config("--speculative-model", "/m/draft")
    with pytest.raises(ConfigError, match="--attach serves a running cluster"):
        config("--attach")
    assert config("--attach", "--address", "auto").cluster.attach
    with pytest.raises(ConfigError, match="min"):
        config("--autoscale", "--min-decode", "5", "--max-decode", "2")


def test_the_cli_turns_a_refusal_into_an_exit_naming_the_flag() -> None:
    from router.cli.serve_args import serve_config

    with pytest.raises(SystemExit, match=r"^baton serve: --tp must be >= 1$"):
        serve_config(parse("--tp", "0"))


def test_secrets_come_from_the_environment_when_no_flag_gives_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_ADMIN_TOKEN", "from-env")
    monkeypatch.setenv("BATON_API_KEY", "key-from-env")
    monkeypatch.setenv("BATON_REDIS_URL", "redis://r:6379")
    got = config()
    assert (got.front_door.admin_token, got.front_door.api_key) == ("from-env", "key-from-env")
    assert got.cluster.redis == "redis://r:6379"
    assert config("--admin-token", "from-flag").front_door.admin_token == "from-flag"
    monkeypatch.setenv("BATON_ADMIN_TOKEN", "")
    assert config().front_door.admin_token is None


def test_every_knob_says_what_it_does_in_the_present_tense() -> None:
    for setting, _ in ServeConfig().knobs():
        text = setting.knob.help + (setting.knob.default_doc or "")
        assert text.strip(), setting.flag
        assert not re.search(r"\bissue \d+|\blooks?\b", text, re.I), setting.flag


def test_a_group_field_must_be_a_knob() -> None:
    @dataclasses.dataclass(frozen=True)
    class Group:
        fine: int = knob(1, "a knob")
        bare: int = 2

    with pytest.raises(TypeError, match=r"Group\.bare is not a knob"):
        settings(Group)


def test_limit_flags_reach_the_door() -> None:
    limits = config("--rate-limit", "2.5", "--max-queued-requests", "4").limits
    assert limits.door_limits() == DoorLimits(rate_per_s=2.5, max_queued=4)
    assert LimitOptions().door_limits().enabled() is False


def test_tracing_is_off_unless_an_endpoint_is_given() -> None:
    spec = config().cluster_spec("/m", "cpu")
    assert spec.tracing.endpoint is None and not spec.tracing.enabled
    on = config("--otlp-traces-endpoint", "127.0.0.1:4317", "--otlp-traces-sample-ratio", "0.25")
    tracing = on.cluster_spec("/m", "cpu").tracing
    assert (tracing.endpoint, tracing.sample_ratio, tracing.enabled) == (
        "127.0.0.1:4317",
        0.25,
        True,
    )
    assert config("--log-requests-json").observability.log_requests_json


@pytest.mark.parametrize("ratio", ["1.5", "-0.1"])
def test_a_sample_ratio_outside_0_1_names_its_flag(ratio: str) -> None:
    with pytest.raises(ConfigError, match="--otlp-traces-sample-ratio"):
        config("--otlp-traces-sample-ratio", ratio)


def test_lora_modules_give_each_worker_their_slots(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config("--lora-modules", "sql=/ad/sql, chat=/ad/chat", "--max-lora-rank", "32")
    assert cfg.model.lora_modules == (("sql", "/ad/sql"), ("chat", "/ad/chat"))
    engine = cfg.engine_config()
    assert (engine.max_loras, engine.max_lora_rank) == (2, 32)
    assert config("--lora-modules", "a=/a", "--max-loras", "4").engine_config().max_loras == 4
    assert config().engine_config().max_loras == 0
    for bad in ("sql", "a=/a,a=/b", "=/a"):
        with pytest.raises(SystemExit):
            parse("--lora-modules", bad)
        assert "--lora-modules" in capsys.readouterr().err
