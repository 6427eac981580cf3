"""Issue 56's targets, read off a device check's report: each with its figure, its bound and
whether it holds (None where a section did not give the figure)."""

from __future__ import annotations

from typing import Any


def _get(report: dict[str, Any], *path: str) -> Any:
    node: Any = report["sections"]
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _target(figure: float | None, bound: float, at_most: bool, what: str) -> dict[str, Any]:
    held = None if figure is None else (figure <= bound if at_most else figure >= bound)
    return {"what": what, "figure": figure, "bound": bound, "at_most": at_most, "held": held}


def evaluate(report: dict[str, Any]) -> list[dict[str, Any]]:
    engine = _get(report, "engine") or {}
    prefills = sorted(int(k.removeprefix("prefill_")) for k in engine if k.startswith("prefill_"))
    longest = f"prefill_{prefills[-1]}" if prefills else None
    peer = _get(report, "peer") or {}
    compiled = (peer.get("compiled_b1") or {}).get("tokens_s")
    batched = [(peer.get(k) or {}).get("tokens_s") for k in ("eager_b64", "static_b64")]
    best_batched = max((b for b in batched if b), default=None)
    rows = _get(report, "kernels", "rows") or []
    out = [
        _target(_get(report, "engine", "decode_b1", "of_floor"), 1.15, True,
                "batch-1 decode step / weight-read floor"),
        _target(_get(report, "engine", "decode_b64", "of_floor"), 1.3, True,
                "batch-64 decode step at 2,048 context / weights + KV floor"),
        _target(longest and _get(report, "engine", longest, "of_matmul_rate"), 0.55, False,
                "longest prefill's model FLOP/s / bf16 matmul FLOP/s"),
        _target(engine.get("short_prefill_over_decode_b1"), 3.0, True,
                "shortest prompt's engine TTFT / batch-1 decode step"),
        _target(_ratio(_get(report, "engine", "offline_b1", "tokens_s"), compiled), 1.0, False,
                "offline batch-1 tokens/s / transformers static cache + compile"),
        _target(_ratio(_get(report, "engine", "offline_b64", "tokens_s"), best_batched), 3.0,
                False, "offline 64 x 512 -> 128 tokens/s / transformers' best batched"),
    ]  # fmt: skip
    for row in rows:
        out.append(_target(row.get("triton_vs_fastest_sdpa"), 0.8, False,
                           f"prefill attention {row['batch']} x {row['length']}: fastest SDPA "
                           "time / Triton time"))  # fmt: skip
    unified = _get(report, "served", "configs", "unified")
    step = _get(report, "engine", "prefill_256", "step_ms")
    low = unified[0].get("ttft_p50_ms") if isinstance(unified, list) and unified else None
    out.append(_target(None if low is None or step is None else low - step, 5.0, True,
                       "served TTFT p50 at the lowest rate - the engine's 256-token prefill "
                       "step, ms"))  # fmt: skip
    plan_rows = _get(report, "plan", "rows") or []
    lowest = next((r for r in plan_rows if "ttft_plan_over_served" in r), {})
    for what in ("ttft", "itl"):
        ratio = lowest.get(f"{what}_plan_over_served")
        out.append(_target(None if ratio is None else abs(ratio - 1), 0.15, True,
                           f"baton plan's {what.upper()} p50 / served 1P+1D's at the lowest "
                           "rate: |ratio - 1|"))  # fmt: skip
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b
