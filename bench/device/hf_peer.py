"""transformers on the device check's checkpoint: the peer of the engine's offline figures,
run in its own process (its memory and a compile that outlasts the budget end with it).

    python -m bench.device.hf_peer CHECKPOINT --out peer.json [--dry-run]

In order, each written to the JSON as soon as it is measured:
    eager_b1            1 x 128 -> 128 greedy, the dynamic cache
    eager_b64           64 x 512 -> 128, left-padded, the dynamic cache
    static_b64          the same with the static cache, not compiled
    compiled_b1         1 x 128 -> 128 with the static cache, which `generate` compiles on
                        a GPU itself (transformers' own torch.compile of the forward, its
                        CUDA graphs): the figure the engine's batch-1 decode is held to (its
                        compile and warm-up runs first, untimed)
The dry run: 1 x 16 -> 8 and 4 x 32 -> 8 on the CPU, and no compile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

RUNS = ("eager_b1", "eager_b64", "static_b64", "compiled_b1")


def generate_rate(
    model: Any, batch: int, prompt_len: int, new: int, device: str, **how: Any
) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(16, model.config.vocab_size, (batch, prompt_len), generator=gen).to(device)
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, **how)
    model.generate(ids, attention_mask=mask, **kwargs)  # warm-up (and compile, if any)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=mask, **kwargs)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return {"tokens_s": batch * new / wall, "wall_s": wall, "batch": batch,
            "prompt": prompt_len, "new": new}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    import transformers
    from transformers import AutoModelForCausalLM

    device = "cpu" if args.dry_run else "cuda"
    report: dict[str, Any] = {"transformers": transformers.__version__}

    def save() -> None:
        # Whole or not at all: the check kills this process at its time limit, maybe mid-write.
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2))
        tmp.replace(args.out)

    start = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16).to(device)
    model.eval()
    report["load_s"] = time.monotonic() - start
    save()
    b1, b64 = ((16, 8), (4, 32, 8)) if args.dry_run else ((128, 128), (64, 512, 128))
    static = {"cache_implementation": "static"}
    runs = {
        "eager_b1": lambda: generate_rate(model, 1, *b1, device),
        "eager_b64": lambda: generate_rate(model, *b64, device),
        # On a GPU `generate` compiles a static cache's forward unless told not to.
        "static_b64": lambda: generate_rate(model, *b64, device, **static, disable_compile=True),
        "compiled_b1": lambda: generate_rate(model, 1, *b1, device, **static),
    }
    assert tuple(runs) == RUNS
    if args.dry_run:
        del runs["compiled_b1"]
    for name, run in runs.items():
        try:
            with torch.no_grad():  # not inference_mode: torch.compile's graphs need autograd's view
                report[name] = run()
        except Exception as e:  # one mode failing leaves the others' figures
            report[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
