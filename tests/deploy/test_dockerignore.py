"""tests/deploy/dockerignore.py answers as BuildKit does: moby/patternmatcher's own
TestMatches vectors for single patterns, and small trees for the walk (order, exceptions,
pruning, anchoring at the context root)."""

from __future__ import annotations

import pytest

from tests.deploy.dockerignore import build_context, compile_patterns, matches, read_patterns

# (pattern, path, excluded), from moby/patternmatcher patternmatcher_test.go TestMatches.
MOBY_VECTORS = [
    ("**", "file", True),
    ("**", "dir/file", True),
    ("**/", "dir/file", True),
    ("**/**", "dir/file", True),
    ("dir/**", "dir/dir2/file", True),
    ("**/dir", "dir", True),
    ("**/dir", "dir/file", True),
    ("**/dir2/*", "dir/dir2/file", True),
    ("**/dir2/**", "dir/dir2/dir3/file", True),
    ("**file", "dir/dir/file", True),
    ("**/file*.txt", "dir/dir/file.txt", True),
    ("**/**/*.txt2", "dir/dir/file.txt", False),
    ("**/*.txt", "file.txt", True),
    ("a**/*.txt", "a/dir/dir/file.txt", True),
    ("a/*.txt", "a/dir/file.txt", False),
    ("a/*.txt", "a/file.txt", True),
    ("a[b-d]e", "ace", True),
    ("a[b-d]e", "aae", False),
    ("a[^b-d]e", "aze", True),
    (".*", ".foo", True),
    (".*", "foo", False),
    ("abc.def", "abcZdef", False),
    ("abc?def", "abcZdef", True),
    ("a\\\\", "a\\", True),
    ("a\\*b", "a*b", True),
    ("**/foo/bar", "dir/dir2/foo/bar", True),
    ("abc/**", "abc", False),
    ("**/.foo", "bar.foo", False),
    ("a.|)$(}+{bc", "a.|)$(}+{bc", True),
    ("dist/*.whl", "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", True),
]

MOBY_MULTI_VECTORS = [
    (["**", "!util/docker/web"], "util/docker/web/foo", False),
    (["**", "!util/docker/web", "util/docker/web/foo"], "util/docker/web/foo", True),
    (["**", "!dist/*.whl"], "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", False),
]


def _excluded_walking_parents(patterns: list[str], path: str) -> bool:
    """Match `path` the way the walk does: each parent first, its results handed down."""
    compiled = compile_patterns(patterns)
    parts = path.split("/")
    parent_matched = None
    for depth in range(1, len(parts)):
        _, parent_matched = matches(compiled, "/".join(parts[:depth]), parent_matched)
    return matches(compiled, path, parent_matched)[0]


@pytest.mark.parametrize(("pattern", "path", "excluded"), MOBY_VECTORS)
def test_single_pattern_vectors(pattern: str, path: str, excluded: bool) -> None:
    assert matches(compile_patterns([pattern]), path)[0] is excluded
    assert _excluded_walking_parents([pattern], path) is excluded


@pytest.mark.parametrize(("patterns", "path", "excluded"), MOBY_MULTI_VECTORS)
def test_multi_pattern_vectors(patterns: list[str], path: str, excluded: bool) -> None:
    assert _excluded_walking_parents(patterns, path) is excluded


def test_reading_the_file() -> None:
    text = "\ufeff# comment\n /foo/ \n\n!\t bar/\n #not a comment\n./baz/../qux\n"
    assert read_patterns(text) == ["foo", "!bar", "#not a comment", "qux"]


CODE = ["x.txt", "bench/b.py", "core/bench/c.py"]
FILES = ["README.md", "README-secret.md", "a.md", *CODE]


@pytest.mark.parametrize(
    ("patterns", "sent"),
    [
        # The last matching line decides (Docker's documented examples).
        (["*.md", "!README*.md", "README-secret.md"], {"README.md", *CODE}),
        (["*.md", "README-secret.md", "!README*.md"], {"README.md", "README-secret.md", *CODE}),
        # Anchored at the context root, unlike .gitignore: only the top-level bench/.
        (["bench"], {"README.md", "README-secret.md", "a.md", "x.txt", "core/bench/c.py"}),
        # An allow-list: everything out, then back in.
        (["**", "!bench/"], {"bench/b.py"}),
        (["**", "!core/bench/c.py"], {"core/bench/c.py"}),
        (["**", "!**/c.py"], {"core/bench/c.py"}),
    ],
)
def test_walk(patterns: list[str], sent: set[str]) -> None:
    assert build_context(patterns, FILES) == sent


def test_excluded_directory_stays_excluded_below_an_exception() -> None:
    files = ["x/y/__pycache__/m.pyc", "x/y/__pycache__/keep", "x/y/z.py"]
    patterns = ["**", "!x/", "**/__pycache__", "!x/y/__pycache__/keep"]
    assert build_context(patterns, files) == {"x/y/z.py", "x/y/__pycache__/keep"}


def test_lone_exclamation_is_an_error() -> None:
    with pytest.raises(ValueError, match="illegal exclusion"):
        compile_patterns(["!"])
