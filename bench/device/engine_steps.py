"""The engine's steps on the device check's checkpoint, each beside its floor (see
figures.py), and its offline throughput: the figures the GPU targets are judged on.

    decode_b1       a 128-token prompt's decode steps (mean over a run)
    decode_b64      64 sequences of 2,048 prompt tokens decoding together (mean step)
    prefill_N       one N-token prompt's step: its forward, its first token (median of 3)
    offline_b1      1 x 128 -> 128, output tokens a second
    offline_b64     64 x 512 -> 128, output tokens a second
    sampler_bN      the sampler alone on 1 and 64 rows of the checkpoint's vocabulary: greedy,
                    top-k, top-p (its nucleus from the kernel, or checked on the host), and
                    top-p by torch.sort alone; a mean over a run of calls, with the host's
                    waits in one call

Decode steps are timed as a run of steps (the device synchronized before and after it), with
the engine's steps overlapped (engine/overlap.py: the engine's default on a GPU; the dry run
forces it) and again one at a time, each with the host's own time a step (scheduling and
processing outputs). Every other step is timed on the host around `engine.step()`, ended by
a sync; each is counted as a graph replay or an eager step. Decode at batch 1 and 64 and the
longest prefill are also profiled kernel by kernel (`kernels`: kernel_profile.py).
The dry run scales every length and batch down (SCALES) and replays through the static
buffers with the re-running capturer.
"""

from __future__ import annotations

import random
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from bench.device import kernel_profile
from bench.device.figures import sync
from core.config import EngineConfig
from core.sampling import SamplingParams

# profiled_steps: decode steps profiled kernel by kernel at batch 1 and 64
# (bench/device/kernel_profile.py).
FULL = dict(b1_prompt=128, b1_steps=32, b64=64, b64_context=2048, b64_steps=8,
            prefills=(2048, 256, 128), offline_b1=(128, 128), offline_b64=(64, 512, 128),
            budget=2048, max_model_len=4096, profiled_steps=6)  # fmt: skip
DRY = dict(b1_prompt=16, b1_steps=4, b64=4, b64_context=64, b64_steps=2,
           prefills=(64, 32, 16), offline_b1=(16, 8), offline_b64=(4, 32, 8),
           budget=64, max_model_len=256, profiled_steps=2)  # fmt: skip


class Counted:
    """Counts the replays of one graph set (wraps its `replay`)."""

    def __init__(self, graphs: Any) -> None:
        self.count = 0
        if graphs is not None:
            replay = graphs.replay

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.count += 1
                return replay(*args, **kwargs)

            graphs.replay = counted


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(16, vocab) for _ in range(n)]


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _syncs(engine: Any, device: torch.device, count: int) -> list[dict] | None:
    """Where `count` overlapped steps made the host wait for the device (torch's sync debug
    mode; each place with how often): a step laid out while the one before runs must not
    wait for it. None off CUDA."""
    if device.type != "cuda":
        return None
    import warnings

    setting, engine.in_flight.enabled = engine.in_flight.enabled, True
    engine.step()
    places: dict[tuple[str, int], int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(count):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            engine.in_flight.enabled = setting
    for w in caught:
        key = (str(w.filename), int(w.lineno))
        places[key] = places.get(key, 0) + 1
    return [{"file": f, "line": n, "count": c} for (f, n), c in sorted(places.items())]


SAMPLER_ROWS = {
    "greedy": SamplingParams(temperature=0.0),
    "top_k_50": SamplingParams(temperature=0.8, top_k=50),
    "top_p_0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "top_p_0.9_seeded": SamplingParams(temperature=0.8, top_p=0.9, seed=1),
}


def sampler_times(device: torch.device, vocab: int, batch: int, calls: int) -> dict[str, Any]:
    """The sampler alone on `batch` rows of bf16 logits (a model's: its top tokens a few
    logits apart), ms a call over a run of `calls`, and how often one call made the host wait
    for the device (CUDA only: None elsewhere). Top-p rows each way (engine.sampling.filters):
    their nucleus from the kernel (the default on CUDA), and checked against their best 1024
    tokens on the host; beside them, top-p by torch.sort alone (vLLM's way without FlashInfer)."""
    from engine.sampler import Sampler, SamplingRow, make_generator
    from engine.sampling.filters import top_p_by_sort

    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(batch, vocab, device=device, generator=generator).mul_(3.0)
    logits = logits.to(torch.bfloat16)
    out: dict[str, Any] = {"batch": batch, "vocab": vocab}

    def timed(call: Any) -> dict[str, Any]:
        call()
        syncs = _waits(call, device)
        sync(device)
        t = time.perf_counter()
        for _ in range(calls):
            call()
        sync(device)
        return {"ms": 1e3 * (time.perf_counter() - t) / calls, "syncs": syncs}

    for name, params in SAMPLER_ROWS.items():
        # Seeded rows draw from host generators, as the engine's requests do.
        rows = [SamplingRow(params, [1], [2], make_generator(params.seed))
                for _ in range(batch)]  # fmt: skip
        for on_device in (True, False) if params.top_p < 1.0 else (None,):
            sampler = Sampler(vocab, seed=0, nucleus_on_device=on_device)
            key = name if on_device is None else f"{name}_{'kernel' if on_device else 'host'}"
            out[key] = timed(lambda s=sampler, r=rows: s.sample(logits, r))
    p = torch.full((batch,), 0.9, device=device)
    out["top_p_0.9_torch_sort"] = timed(lambda: top_p_by_sort(logits.float(), p))
    return out


def _waits(call: Any, device: torch.device) -> int | None:
    """How often `call` made the host wait for the device (torch's sync debug mode)."""
    if device.type != "cuda":
        return None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return len(caught)


def measure(model_dir: Path, device: torch.device, rates: dict[str, Any], small: bool) -> dict:
    """The engine's figures; where one fails, those measured before it and the error (the
    check's --resume runs the section again)."""
    out: dict[str, Any] = {}
    try:
        _measure(out, model_dir, device, rates, small)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    return out


def _measure(
    out: dict[str, Any], model_dir: Path, device: torch.device, rates: dict[str, Any], small: bool
) -> None:
    from engine.cuda_graphs import RerunCapturer
    from engine.engine import LLMEngine

    sizes = DRY if small else FULL
    config = EngineConfig(
        device=device.type, dtype="bfloat16", attention_backend="triton",
        max_num_seqs=64 if not small else 8, max_num_batched_tokens=sizes["budget"],
        max_model_len=sizes["max_model_len"], enable_prefix_caching=False,
        gpu_memory_utilization=0.6, num_kv_blocks=512 if small else None,
        num_threads=1 if small else None, overlap_steps=True,
    )  # fmt: skip
    start = time.monotonic()
    engine = LLMEngine(model_dir, config, capturer=RerunCapturer() if small else None)
    out["start_s"] = time.monotonic() - start
    runner = engine.runner
    decode_graphs, step_graphs = Counted(runner.decode_graphs), Counted(runner.step_graphs)
    for name, graphs in (
        ("decode_graphs", runner.decode_graphs),
        ("step_graphs", runner.step_graphs),
    ):
        if graphs is None:
            out[name] = None
            continue
        used = graphs.graph_bytes
        out[name] = {"sizes": graphs.sizes, "capture_s": graphs.capture_s,
                     "graph_gib": None if used is None else used / 2**30,
                     "layer_events": getattr(graphs, "layer_events", None)}  # fmt: skip
    # What the KV sizing left the graphs (both sets share one pool), against their sum.
    out["graph_pool_set_aside_gib"] = runner.graph_pool_bytes / 2**30
    mc = engine.model_config
    embed = mc.vocab_size * mc.hidden_size
    # What a step reads: every weight but the embedding table, of which it reads a row a
    # token (untied; a tied table is the LM head's, read whole).
    untied = 0 if mc.tie_word_embeddings else embed
    element = next(runner.model.parameters()).element_size()
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    weight_bytes -= untied * element
    dense_params = sum(p.numel() for p in runner.model.parameters()) - 2 * embed
    kv_token_bytes = runner.kv_layout.block_bytes_all_layers // config.block_size
    copy_rate = rates.get("copy_gb_s", 0) * 1e9
    matmul_rate = rates.get("matmul_tflop_s", 0) * 1e12
    out["weights_read_gib"] = weight_bytes / 2**30  # a decode step's, the floor's
    rng = random.Random(0)
    vocab = mc.vocab_size
    first_step = engine.step_totals.steps  # steps launched (a call may only land one)
    overlapped = engine.in_flight.enabled  # the engine's own setting (the config's: on)

    def timed_steps(limit: int | None = None, ready: Any = None) -> list[float]:
        times: list[float] = []
        while engine.has_unfinished() and (limit is None or len(times) < limit):
            sync(device)
            t = time.perf_counter()
            deltas = engine.step()
            sync(device)
            times.append(time.perf_counter() - t)
            if ready is not None:
                ready(deltas)
        return times

    def mean_step(count: int, overlap: bool) -> tuple[float, float]:
        """(mean step, host time beside the device a step) over `count` decode steps run
        back to back, steps overlapped or one at a time (after one step untimed: the
        switch; the engine's own setting back after). Timed as a run, not step by step: a
        sync between steps would end the overlap it measures."""
        engine.in_flight.enabled = overlap
        engine.step()
        totals = engine.step_totals
        host = totals.schedule_s + totals.output_s
        sync(device)
        t = time.perf_counter()
        for _ in range(count):
            engine.step()
        sync(device)
        host = totals.schedule_s + totals.output_s - host
        engine.in_flight.enabled = overlapped
        return (time.perf_counter() - t) / count, host / count

    def floor_decode(contexts: list[int]) -> float | None:
        if not copy_rate:
            return None
        return (weight_bytes + sum(contexts) * kv_token_bytes) / copy_rate

    # Decode at batch 1: steps overlapped (engine/overlap.py), then one at a time.
    k = sizes["b1_steps"]
    engine.add_request("b1", _prompt(rng, sizes["b1_prompt"], vocab), _params(20 + 2 * k))
    timed_steps(limit=1)  # the prompt
    step, host = mean_step(k, overlapped)
    single, single_host = mean_step(k, False)
    out["syncs_in_overlapped_steps"] = _syncs(engine, device, 4)
    b1_kernels = kernel_profile.guarded(engine.step, sizes["profiled_steps"], device)
    timed_steps()  # what is left of it
    floor = floor_decode([sizes["b1_prompt"] + k])
    out["decode_b1"] = {"step_ms": 1e3 * step, "floor_ms": floor and 1e3 * floor,
                        "of_floor": floor and step / floor, "overlapped": overlapped,
                        "host_ms": 1e3 * host, "one_at_a_time_ms": 1e3 * single,
                        "one_at_a_time_host_ms": 1e3 * single_host,
                        "kernels": b1_kernels}  # fmt: skip

    # Decode at batch 64, 2,048-token contexts: timed once every sequence is decoding.
    n, ctx = sizes["b64"], sizes["b64_context"]
    started: set[str] = set()
    # Tokens enough for the first to decode through every later one's prompt (a step each,
    # more where decode rows push a prompt into two chunks), both timed runs and the
    # profile, with room to spare: a row that finished early would leave the batch short.
    tokens = 2 * n + 2 * (sizes["b64_steps"] + 1) + sizes["profiled_steps"] + 8
    for i in range(n):
        engine.add_request(f"d{i}", _prompt(rng, ctx, vocab), _params(tokens))

    def note(deltas: list) -> None:
        started.update(d.request_id for d in deltas if d.new_token_ids)

    while len(started) < n and engine.has_unfinished():
        timed_steps(limit=1, ready=note)
    contexts = [r.num_tokens for r in engine.requests.values()]
    step, host = mean_step(sizes["b64_steps"], overlapped)
    single, single_host = mean_step(sizes["b64_steps"], False)
    floor = floor_decode(contexts)
    b64_kernels = kernel_profile.guarded(engine.step, sizes["profiled_steps"], device)
    out["decode_b64"] = {"step_ms": 1e3 * step, "floor_ms": floor and 1e3 * floor,
                         "of_floor": floor and step / floor, "batch": len(contexts),
                         "mean_context": sum(contexts) / max(1, len(contexts)),
                         "overlapped": overlapped, "host_ms": 1e3 * host,
                         "one_at_a_time_ms": 1e3 * single,
                         "one_at_a_time_host_ms": 1e3 * single_host,
                         "kernels": b64_kernels}  # fmt: skip
    timed_steps()  # the rest of their tokens

    # Prefill steps: one prompt alone, to its first token (overlapped, the token lands in
    # the call after the one that launched the step: both are timed).
    layers, heads, head_dim = mc.num_hidden_layers, mc.num_attention_heads, mc.head_dim
    for length in sizes["prefills"]:
        times = []
        for k in range(3):
            engine.add_request(f"p{length}-{k}", _prompt(rng, length, vocab), _params(1))
            times.append(sum(timed_steps()))
        step = statistics.median(times)
        flops = (
            2 * dense_params * length + 2 * embed + 4 * layers * heads * head_dim * length**2 / 2
        )
        out[f"prefill_{length}"] = {
            "step_ms": 1e3 * step, "model_tflop": flops / 1e12,
            "of_matmul_rate": matmul_rate and flops / step / matmul_rate,
        }  # fmt: skip
        if length == sizes["prefills"][0]:  # the long prompt: its kernels, to its first token
            engine.add_request(f"p{length}-kernels", _prompt(rng, length, vocab), _params(1))
            prefill_kernels = kernel_profile.guarded(timed_steps, 1, device)
            out[f"prefill_{length}"]["kernels"] = prefill_kernels

    # Offline throughput.
    prompt_len, max_tokens = sizes["offline_b1"]
    engine.add_request("o1", _prompt(rng, prompt_len, vocab), _params(max_tokens))
    t = time.perf_counter()
    timed_steps()
    out["offline_b1"] = {"tokens_s": max_tokens / (time.perf_counter() - t)}
    batch, prompt_len, max_tokens = sizes["offline_b64"]
    for i in range(batch):
        engine.add_request(f"o64-{i}", _prompt(rng, prompt_len, vocab), _params(max_tokens))
    t = time.perf_counter()
    timed_steps()
    out["offline_b64"] = {"tokens_s": batch * max_tokens / (time.perf_counter() - t)}

    for rows in (1, n):
        try:  # a figure beside the steps', never a reason to lose them
            out[f"sampler_b{rows}"] = sampler_times(device, vocab, rows, 20 if not small else 2)
        except Exception as e:
            out[f"sampler_b{rows}"] = {"error": f"{type(e).__name__}: {e}"}
    replays = decode_graphs.count + step_graphs.count
    total = engine.step_totals.steps - first_step
    out["overlapped_steps"] = engine.step_totals.overlapped_steps
    out["steps"] = {"total": total, "decode_graph": decode_graphs.count,
                    "step_graph": step_graphs.count, "eager": total - replays}  # fmt: skip
    b1, p128 = out["decode_b1"]["step_ms"], out[f"prefill_{sizes['prefills'][-1]}"]["step_ms"]
    out["short_prefill_over_decode_b1"] = p128 / b1
    out["headline"] = {
        "decode_b1_of_floor": out["decode_b1"]["of_floor"],
        "decode_b64_of_floor": out["decode_b64"]["of_floor"],
        "prefill_long_of_matmul": out[f"prefill_{sizes['prefills'][0]}"]["of_matmul_rate"],
        "short_prefill_over_decode_b1": out["short_prefill_over_decode_b1"],
        "offline_b1_tok_s": out["offline_b1"]["tokens_s"],
        "offline_b64_tok_s": out["offline_b64"]["tokens_s"],
        "eager_steps": out["steps"]["eager"],
    }
