"""`baton serve`'s KV-cache and routing flags reach the engine config every worker is started
with and the router."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli.main import build_parser
from router.cli.serve import build_spec


def engine_config(*flags: str):  # -> EngineConfig
    args = build_parser().parse_args(["serve", "--device", "cpu", *flags])
    return build_spec(args, Path("/models/m")).engine


def test_by_default_the_gpu_share_sizes_the_cache() -> None:
    config = engine_config()
    assert config.kv_cache_memory_bytes is None
    assert config.gpu_memory_utilization == 0.9


def test_both_flags_pass_through() -> None:
    config = engine_config("--kv-cache-gb", "2.5", "--gpu-memory-utilization", "0.75")
    assert config.kv_cache_memory_bytes == int(2.5 * (1 << 30))
    assert config.gpu_memory_utilization == 0.75


def test_help_lists_the_utilization_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert "--gpu-memory-utilization" in capsys.readouterr().out


def test_conditional_disaggregation_threshold_reaches_the_router() -> None:
    from router.cli.serve import router_config

    parse = build_parser().parse_args
    assert router_config(parse(["serve"])).disagg_min_uncached_tokens == 256
    config = router_config(parse(["serve", "--disagg-min-uncached-tokens", "0"]))
    assert config.disagg_min_uncached_tokens == 0
    with pytest.raises(SystemExit, match="must be >= 0"):
        router_config(parse(["serve", "--disagg-min-uncached-tokens", "-1"]))


def test_prefix_promises_reach_the_router_and_zero_turns_them_off() -> None:
    from router.cli.serve import router_config

    parse = build_parser().parse_args
    assert router_config(parse(["serve"])).pending_ttl_s == 600.0
    assert router_config(parse(["serve", "--prefix-promise-s", "0"])).pending_ttl_s == 0.0
    with pytest.raises(SystemExit, match="--prefix-promise-s"):
        router_config(parse(["serve", "--prefix-promise-s", "-1"]))


def test_late_binding_is_a_router_switch() -> None:
    from router.cli.serve import router_config

    parse = build_parser().parse_args
    assert not router_config(parse(["serve"])).late_binding
    assert router_config(parse(["serve", "--late-binding"])).late_binding


def test_the_gate_s_order_is_a_router_setting() -> None:
    from router.cli.serve import router_config

    parse = build_parser().parse_args
    assert router_config(parse(["serve"])).gate_max_skips == 16
    assert router_config(parse(["serve", "--gate-max-skips", "0"])).gate_max_skips == 0
    with pytest.raises(SystemExit, match="--gate-max-skips"):
        router_config(parse(["serve", "--gate-max-skips", "-1"]))


def test_the_ttft_policys_flags_reach_it_and_no_other_policy() -> None:
    from router.cli.serve import router_config

    parse = build_parser().parse_args
    assert router_config(parse(["serve", "--policy", "ttft"])).prefill_policy_args == {}
    config = router_config(
        parse(["serve", "--policy", "ttft", "--balance-slack", "0.2", "--prefix-pull-gbps", "2"])
    )
    assert config.prefill_policy_args == {"balance_slack": 0.2, "transfer_gbps": 2.0}
    with pytest.raises(SystemExit, match="--balance-slack needs --policy ttft"):
        router_config(parse(["serve", "--balance-slack", "0"]))
    with pytest.raises(SystemExit, match="--balance-slack must be >= 0"):
        router_config(parse(["serve", "--policy", "ttft", "--balance-slack", "-1"]))
    measured = router_config(parse(["serve", "--policy", "ttft", "--balance-measured"]))
    assert measured.prefill_policy_args == {"balance_measured": True}
    with pytest.raises(SystemExit, match="--balance-measured needs --policy ttft"):
        router_config(parse(["serve", "--balance-measured"]))
    room = router_config(parse(["serve", "--policy", "ttft", "--balance-room"]))
    assert room.prefill_policy_args == {"balance_room": True}
    assert router_config(parse(["serve", "--policy", "ttft"])).prefill_policy_args == {}
    no_room = router_config(parse(["serve", "--policy", "ttft", "--no-balance-room"]))
    assert no_room.prefill_policy_args == {"balance_room": False}
    with pytest.raises(SystemExit, match="--balance-room needs --policy ttft"):
        router_config(parse(["serve", "--balance-room"]))
    with pytest.raises(SystemExit, match="--no-balance-room needs --policy ttft"):
        router_config(parse(["serve", "--no-balance-room"]))
