"""`baton`: the command line.

Subcommands import their heavy dependencies (torch, the engine) lazily, so `baton --help`
is instant and the router package stays torch-free.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from router.cli.serve_args import add_serve_arguments

DEFAULT_MODEL_DIR = Path("models/tiny-llama")


def _add_make_tiny_model(sub: argparse._SubParsersAction) -> None:
    from engine.tiny_model import build_arg_parser, run_from_args

    p = sub.add_parser(
        "make-tiny-model",
        help="write a random-weight checkpoint in Hugging Face format (tests, demos, benches)",
    )
    build_arg_parser(p)
    p.set_defaults(func=run_from_args)


def _ensure_model(model_dir: Path) -> Path:
    if (model_dir / "config.json").exists():
        return model_dir
    from engine.tiny_model import make_tiny_model

    logging.info("no model at %s: making the tiny demo model there", model_dir)
    return Path(make_tiny_model(model_dir, arch="llama", preset="tiny", seed=0))


def _run_demo(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams

    model_dir = _ensure_model(Path(args.model))
    start = time.monotonic()
    llm = LLM(model_dir, num_threads=args.threads)
    messages = [
        [{"role": "user", "content": "Tell me about batons."}],
        [{"role": "user", "content": "What is a relay race?"}],
    ]
    tok = llm.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template(m, add_generation_prompt=True), add_special_tokens=False)
        for m in messages
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0.0))
    for m, out in zip(messages, outs, strict=True):
        print(
            f"> {m[0]['content']}\n{out.text!r}  [{len(out.token_ids)} tokens, "
            f"{out.finish_reason}, ttft {out.timings.ttft_s:.3f} s]"
        )
    elapsed = time.monotonic() - start
    print(f"model {model_dir} (random weights: the text is noise), {elapsed:.1f} s")
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    from router.cli.serve import serve

    return serve(args)


def _add_bench_arguments(p: argparse.ArgumentParser) -> None:
    try:
        from bench.serve import build_arg_parser
    except ImportError:  # an installed package without the repo's bench/ folder
        return
    build_arg_parser(p)


def _run_bench(args: argparse.Namespace) -> int:
    from bench.serve import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_make_tiny_model(sub)
    demo = sub.add_parser("demo", help="generate with the engine in this process")
    demo.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    demo.add_argument("--max-tokens", type=int, default=24)
    demo.add_argument("--threads", type=int, default=2)
    demo.set_defaults(func=_run_demo)
    serve = sub.add_parser("serve", help="start the cluster and its front doors")
    add_serve_arguments(serve)
    serve.set_defaults(func=_run_serve)
    bench = sub.add_parser(
        "bench", help="open-loop load against a serving cluster (bench/serve.py)"
    )
    bench.set_defaults(func=_run_bench, bench_parser=bench)
    _add_bench_arguments(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
