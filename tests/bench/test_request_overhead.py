"""A served request's overhead on its first token (bench/planning/request_overhead.py): its
TTFT less the engine time its first token took."""

from __future__ import annotations

import pytest

from bench.planning import request_overhead


def test_request_overhead_is_ttft_less_the_engine_time_of_the_first_token() -> None:
    def scrape(prefill_s: float, decode_s: float) -> str:
        return "\n".join(
            f'baton:worker_step_seconds_total{{worker="{w}",phase="forward"}} {v}'
            for w, v in (("prefill-0", prefill_s), ("decode-1", decode_s))
        )

    before, after = scrape(1.0, 2.0), scrape(1.2, 2.03)
    # through the prefill pool: the decode worker's step after the admission is not counted
    assert request_overhead.overhead_ms(0.25, before, after, True) == pytest.approx(50.0)
    assert request_overhead.overhead_ms(0.25, before, after, False) == pytest.approx(20.0)
