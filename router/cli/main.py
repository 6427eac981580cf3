"""`baton`: the command line.

Subcommands import their heavy dependencies (torch, the engine) lazily, so `baton --help`
is instant and the router package stays torch-free. Packages installed beside Baton may add
subcommands through the `baton.commands` entry point group (a function that takes the
subparsers): `baton profile` and `baton plan` come that way from planner/, `baton bench`
from loadgen/, which the router never imports.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

from router.cli.serve_args import add_serve_arguments

PLUGIN_GROUP = "baton.commands"

logger = logging.getLogger(__name__)


def _run_make_tiny_model(args: argparse.Namespace) -> int:
    from engine.tiny_model import run_from_args

    return run_from_args(args)


def _run_quantize(args: argparse.Namespace) -> int:
    from engine.int8_checkpoint import run_from_args

    return run_from_args(args)


def _run_import_gguf(args: argparse.Namespace) -> int:
    from router.cli.model_dir import run_import_gguf

    return run_import_gguf(args.src, args.dst)


def _run_demo(args: argparse.Namespace) -> int:
    from router.cli.demo import run_demo

    return run_demo(args)


def _run_serve(args: argparse.Namespace) -> int:
    from router.cli.serve import serve

    return serve(args)


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            entry.load()(sub)
        except ImportError as e:  # a plugin whose dependencies are missing: say, go on
            logger.debug("baton command %s unavailable: %s", entry.name, e)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    from engine.tiny_model import build_arg_parser as add_tiny_model_arguments

    tiny = sub.add_parser(
        "make-tiny-model",
        help="write a random-weight checkpoint in Hugging Face format (tests, demos, benches)",
    )
    add_tiny_model_arguments(tiny)
    tiny.set_defaults(func=_run_make_tiny_model)
    quantize = sub.add_parser(
        "quantize",
        help="write an INT8 copy of a checkpoint (weights per channel; loads at int8 size)",
    )
    quantize.add_argument("src", metavar="SRC", help="float Hugging Face checkpoint folder")
    quantize.add_argument("dst", metavar="DST", help="output folder (new or empty)")
    quantize.set_defaults(func=_run_quantize)
    gguf = sub.add_parser(
        "import-gguf",
        help="write a GGUF checkpoint as a Hugging Face folder (dequantized to float32)",
    )
    gguf.add_argument("src", metavar="FILE", help="GGUF file (llama, mistral, qwen2, qwen3)")
    gguf.add_argument("dst", metavar="DIR", help="output folder (replaced if it exists)")
    gguf.set_defaults(func=_run_import_gguf)
    demo = sub.add_parser(
        "demo", help="a two-turn chat through both pools of a local cluster (prefix cache hit)"
    )
    demo.add_argument("--model", default=None, help="checkpoint folder or GGUF file "
                      "(default: the default model)")  # fmt: skip
    demo.add_argument("--max-tokens", type=int, default=48)
    demo.add_argument("--threads", type=int, default=1, help="compute threads per worker")
    demo.set_defaults(func=_run_demo)
    serve = sub.add_parser("serve", help="start the cluster and its front doors")
    add_serve_arguments(serve)
    serve.set_defaults(func=_run_serve)
    _add_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
