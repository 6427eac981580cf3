"""Find the `baton serve` command lines the deploy configs run and parse them with the CLI's
own parser, so a flag the CLI does not know fails here and not on a cluster."""

from __future__ import annotations

import argparse
import re
import shlex

from router.cli.main import build_parser

_SHELL_OPERATOR = re.compile(r"^[();<>|&]+$")
_KUBELET_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def parse_serve(argv: list[str]) -> argparse.Namespace:
    """Parse `baton serve ...` (argv[0] is the program) as `baton` itself would.

    argparse exits on a bad command line; turn that into an assertion naming the line.
    """
    assert argv[:2] == ["baton", "serve"], f"not a `baton serve` command: {argv}"
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"`baton` rejects this command line: {shlex.join(argv)}") from exc


def serve_argv_in_shell(command: str) -> list[str] | None:
    """The `baton serve ...` words in a shell command line, up to the first operator
    (redirection, `&`, `;`, `|`), or None when the line does not run it."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    for i in range(len(words) - 1):
        if words[i] == "baton" and words[i + 1] == "serve":
            argv = []
            for word in words[i:]:
                if _SHELL_OPERATOR.match(word):
                    break
                argv.append(word)
            return argv
    return None


def expand_kubelet_refs(argv: list[str], env_names: set[str]) -> list[str]:
    """Replace $(VAR) the way the kubelet does, failing on a reference to an env var the
    container does not define (the kubelet would leave it verbatim: a silent bug)."""
    out = []
    for arg in argv:
        for name in _KUBELET_REF.findall(arg):
            assert name in env_names, f"{arg!r} refers to ${name}, not in the container's env"
        out.append(_KUBELET_REF.sub(lambda m: f"<{m.group(1)}>", arg))
    return out
