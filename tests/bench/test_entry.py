"""`python -m bench`: the lab's one entry lists every benchmark by subject and runs one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import SUBJECTS, benchmarks, main

README = Path(__file__).resolve().parents[2] / "bench" / "README.md"


def test_every_benchmark_is_listed_and_documented(capsys) -> None:
    assert main([]) == 0
    listed = capsys.readouterr().out
    readme = README.read_text()
    for subject in SUBJECTS:
        names = benchmarks(subject)
        assert names, subject
        assert f"{subject:<9} {' '.join(names)}" in listed
        undocumented = [n for n in names if f"bench.{subject}.{n}" not in readme]
        assert not undocumented, f"bench/README.md lacks {subject}: {undocumented}"


def test_a_benchmark_runs_by_subject_and_name(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["routing", "router_sweep", "--help"])
    assert exit_.value.code == 0 and "--policy-args" in capsys.readouterr().out
    assert main(["routing", "no_such_bench"]) == 2
