"""The build context a .dockerignore leaves, computed the way BuildKit computes it.

A port of three small pieces of Go that `docker build` runs, kept line for line so a
reader can hold them side by side:

- moby/patternmatcher `ignorefile.ReadAll`: reading the file (comments, `!`, cleaning);
- moby/patternmatcher `Pattern.compile` / `match` and `MatchesUsingParentResults`: one
  pattern, and the last-match-wins pass over all of them, carrying each directory's
  per-pattern matches down to its children;
- tonistiigi/fsutil `filterFS.Walk` (filter.go): the walk BuildKit sends a local context
  with, which prunes an excluded directory unless an exception (`!dir/...`) reaches into
  it.

Why a port rather than a library. docker-py (`docker.utils.build.exclude_paths`) ports
moby's *deprecated* `Matches`, which checks a single parent directory against each
pattern (the bug moby deprecated it for): with `**`, `!x/`, `**/__pycache__`,
`!x/y/__pycache__/keep` it sends `x/y/__pycache__/m.pyc`, which BuildKit leaves out. It
also appends `!Dockerfile` to every list, has no `\\` escapes, and reads `**foo` as
"a name equal to foo" where moby reads "ends in foo". pathspec's gitwildmatch follows
.gitignore: there `bench` matches at any depth, not only at the root. Each answers
another question than "what will `docker build` send"; tests/deploy/test_dockerignore.py
checks this port against moby's own test vectors. Linux paths only (the image is built
on Linux).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

# Regexp characters with no meaning in a filepath pattern: escaped when compiling.
_ESCAPED = frozenset(".+()|{}$")
_UTF8_BOM = "\ufeff"


def read_patterns(text: str) -> list[str]:
    """ignorefile.ReadAll: the patterns of a .dockerignore, in order, `!` kept."""
    patterns = []
    for number, line in enumerate(text.splitlines()):
        if number == 0:
            line = line.removeprefix(_UTF8_BOM)
        if line.startswith("#"):  # a comment only in column 1, before trimming
            continue
        line = line.strip()
        if not line:
            continue
        invert = line.startswith("!")
        if invert:
            line = line[1:].strip()
        if line:
            line = posixpath.normpath(line)
            if len(line) > 1 and line.startswith("/"):
                line = line[1:]
        patterns.append("!" + line if invert else line)
    return patterns


class _Kind(Enum):
    EXACT = "exact"
    PREFIX = "prefix"  # "dir/**": everything under dir/
    SUFFIX = "suffix"  # "**/name": name at any depth
    REGEXP = "regexp"


@dataclass
class Pattern:
    """One line of the file after cleaning; `text` without its `!`."""

    text: str
    exclusion: bool
    kind: _Kind = _Kind.EXACT
    regexp: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        self._compile()

    def _compile(self) -> None:
        """Pattern.compile: classify, and build a regexp where a plain comparison won't do."""
        text, n = self.text, len(self.text)
        regexp, kind, pos, first = "^", _Kind.EXACT, 0, True
        while pos < n:
            ch = text[pos]
            pos += 1
            if ch == "*" and pos < n and text[pos] == "*":
                pos += 1
                if pos < n and text[pos] == "/":  # "**/" reads as "**"
                    pos += 1
                if pos == n:  # trailing "**": everything below
                    if kind is _Kind.EXACT:
                        kind = _Kind.PREFIX
                    else:
                        regexp += ".*"
                        kind = _Kind.REGEXP
                else:  # any number of directories, zero included
                    regexp += "(.*/)?"
                    kind = _Kind.REGEXP
                if first:
                    kind = _Kind.SUFFIX
            elif ch == "*":
                regexp += "[^/]*"
                kind = _Kind.REGEXP
            elif ch == "?":
                regexp += "[^/]"
                kind = _Kind.REGEXP
            elif ch in _ESCAPED:
                regexp += "\\" + ch
            elif ch == "\\":
                if pos < n:
                    regexp += "\\" + text[pos]
                    pos += 1
                    kind = _Kind.REGEXP
                else:
                    regexp += "\\\\"
            elif ch in "[]":
                regexp += ch
                kind = _Kind.REGEXP
            else:
                regexp += ch
            first = False
        self.kind = kind
        if kind is _Kind.REGEXP:
            self.regexp = re.compile(regexp + "$")

    def match(self, path: str) -> bool:
        if self.kind is _Kind.EXACT:
            return path == self.text
        if self.kind is _Kind.PREFIX:
            return path.startswith(self.text[:-2])
        if self.kind is _Kind.SUFFIX:
            suffix = self.text[2:]
            # "**/foo" also matches "foo" itself
            return path.endswith(suffix) or (suffix[:1] == "/" and path == suffix[1:])
        assert self.regexp is not None
        return self.regexp.match(path) is not None

    def without_trailing_glob(self) -> str:
        """fsutil's patternWithoutTrailingGlob: "dir/**" and "dir/*" become "dir"."""
        return self.text.removesuffix("/**").removesuffix("/*")


def compile_patterns(patterns: Iterable[str]) -> list[Pattern]:
    """patternmatcher.New: clean each line again and split off its `!`."""
    compiled = []
    for line in patterns:
        line = line.strip()
        if not line:
            continue
        line = posixpath.normpath(line)
        exclusion = line.startswith("!")
        if exclusion:
            if len(line) == 1:
                raise ValueError('illegal exclusion pattern: "!"')
            line = line[1:]
        compiled.append(Pattern(line, exclusion))
    return compiled


def matches(
    patterns: list[Pattern], path: str, parent_matched: list[bool] | None = None
) -> tuple[bool, list[bool]]:
    """MatchesUsingParentResults: is `path` excluded, and which patterns matched it.

    The last pattern that matches decides (a `!` one re-includes). A pattern that matched
    the parent directory matches the child too. `parent_matched` is the parent's second
    return value; without it the path's parent directories are matched here."""
    excluded = False
    matched_now = [False] * len(patterns)
    for i, pattern in enumerate(patterns):
        hit = bool(parent_matched and parent_matched[i])
        if not hit:
            # An exclusion cannot change an unexcluded path, nor an inclusion an excluded one.
            if pattern.exclusion != excluded:
                continue
            hit = pattern.match(path)
            if not hit and not parent_matched:
                parts = posixpath.dirname(path).split("/") if "/" in path else []
                hit = any(pattern.match("/".join(parts[: k + 1])) for k in range(len(parts)))
        matched_now[i] = hit
        if hit:
            excluded = not pattern.exclusion
    return excluded, matched_now


@dataclass
class _Dir:
    children: dict[str, _Dir] = field(default_factory=dict)
    is_file: bool = False


def _tree(files: Iterable[str]) -> _Dir:
    root = _Dir()
    for path in files:
        node = root
        for part in path.split("/"):
            node = node.children.setdefault(part, _Dir())
        node.is_file = True
    return root


def build_context(patterns: list[str], files: Iterable[str]) -> set[str]:
    """The files of `files` (slash-separated, relative to the context root) that BuildKit
    sends for these .dockerignore patterns: fsutil's filtered walk, in lexical order."""
    compiled = compile_patterns(patterns)
    # fsutil prunes an excluded directory only when every exception is a plain prefix.
    plain_exceptions = not any(
        set(p.without_trailing_glob()) & set("*[]?^\\") for p in compiled if p.exclusion
    )
    exceptions = [p.without_trailing_glob() + "/" for p in compiled if p.exclusion]
    sent: set[str] = set()

    def walk(node: _Dir, prefix: str, parent_matched: list[bool] | None) -> None:
        for name in sorted(node.children):
            child, path = node.children[name], prefix + name
            excluded, matched_now = matches(compiled, path, parent_matched)
            if child.is_file:
                if not excluded:
                    sent.add(path)
                continue
            reached = any(e.startswith(path + "/") for e in exceptions)
            if excluded and plain_exceptions and not reached:
                continue  # filepath.SkipDir: no exception reaches inside
            walk(child, path + "/", matched_now)

    walk(_tree(files), "", None)
    return sent
