"""The lab's one entry: `python -m bench` lists the benchmarks by subject, and
`python -m bench SUBJECT NAME [ARGS...]` runs `bench/SUBJECT/NAME.py` with ARGS (the same as
`python -m bench.SUBJECT.NAME ARGS...`). bench/README.md says what each one measures."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUBJECTS = (
    "engine", "transfer", "routing", "serving", "planning", "chaos", "observability", "device",
)  # fmt: skip


def benchmarks(subject: str) -> list[str]:
    """The runnable modules of a subject (those with a `__main__` block)."""
    return sorted(
        p.stem for p in (HERE / subject).glob("*.py")
        if p.stem != "__init__" and '__name__ == "__main__"' in p.read_text()
    )  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        for subject in SUBJECTS:
            print(f"{subject:<9} {' '.join(benchmarks(subject))}")
        print("\npython -m bench SUBJECT NAME [ARGS...]   (bench/README.md)")
        return 0 if not argv else 2
    subject, name, *args = argv
    if subject not in SUBJECTS or name not in benchmarks(subject):
        print(f"no benchmark {subject} {name}: python -m bench lists them", file=sys.stderr)
        return 2
    sys.argv = [f"bench.{subject}.{name}", *args]
    runpy.run_module(f"bench.{subject}.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
