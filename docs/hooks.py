"""mkdocs hooks: the site is built from the Markdown that GitHub shows, unchanged in the repository.

- The repository's top-level pages join the site: README.md as its home page, CHANGELOG.md,
  BENCHMARKS.md and CONTRIBUTING.md under their own names, and every other repository file
  a page links to (an example inventory, a script's README), so one link works on GitHub and
  on the site; `mkdocs build --strict` fails on a link to a file that does not exist.
- Links are written for GitHub (relative to the file's place in the repository); they are
  rewritten to the site's layout (`docs/x.md` from the README is `x.md` on the site).
- Lists are written as GitHub reads them (a list right after a paragraph, a nested item
  indented to its parent's text); Python-Markdown wants a blank line before a list and four
  spaces per level, so each page's lists are re-indented for it before it is rendered.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

#: Top-level files that are pages of the site, and their names there.
ROOT_PAGES = {
    "README.md": "index.md",
    "CHANGELOG.md": "CHANGELOG.md",
    "BENCHMARKS.md": "BENCHMARKS.md",
    "CONTRIBUTING.md": "CONTRIBUTING.md",
}
DOCS = "docs"
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^\s*(```|~~~)")
LOG = logging.getLogger("mkdocs.hooks.sshddp")  # a warning here fails --strict
ITEM = re.compile(r"^( *)([-*+]|\d+[.)])( +)\S")


def _root(config: Any) -> Path:
    return Path(config.config_file_path).parent


_COPIED: set[str] = set()  # repository files a page links to, copied onto the site


def _repo_path(site_uri: str) -> str:
    """Where a site file's source sits in the repository."""
    for repo, site in ROOT_PAGES.items():
        if site == site_uri:
            return repo
    return site_uri if site_uri in _COPIED else f"{DOCS}/{site_uri}"


def _site_path(repo_path: str) -> str:
    """Where a repository file sits on the site."""
    if repo_path in ROOT_PAGES:
        return ROOT_PAGES[repo_path]
    if repo_path.startswith(DOCS + "/"):
        return repo_path[len(DOCS) + 1 :]
    return repo_path


def _links(markdown: str) -> list[str]:
    return [m.group(2) for m in LINK.finditer(markdown)]


def _local(target: str) -> str | None:
    """The path part of a relative link, or None for an external one or an anchor."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    return target.split("#", 1)[0] or None


def on_files(files: Files, config: Any) -> Files:
    root = _root(config)
    for repo, site in ROOT_PAGES.items():
        files.append(File.generated(config, site, abs_src_path=str(root / repo)))
    sources = [root / repo for repo in ROOT_PAGES] + sorted((root / DOCS).rglob("*.md"))
    for src in sources:
        base = posixpath.dirname(src.relative_to(root).as_posix())
        for target in _links(src.read_text(encoding="utf-8")):
            path = _local(target)
            if path is None:
                continue
            repo = posixpath.normpath(posixpath.join(base, path))
            if repo.startswith(DOCS + "/") or repo in ROOT_PAGES or repo.startswith(".."):
                continue
            if (root / repo).is_file() and files.get_file_from_path(repo) is None:
                _COPIED.add(repo)
                # Reached by its link only: not in the nav, and no warning that it is not.
                files.append(
                    File.generated(
                        config,
                        repo,
                        abs_src_path=str(root / repo),
                        inclusion=InclusionLevel.NOT_IN_NAV,
                    )
                )
    return files


def _rewrite(markdown: str, repo_file: str, root: Path) -> str:
    base = posixpath.dirname(repo_file)
    site_base = posixpath.dirname(_site_path(repo_file))

    def one(m: re.Match[str]) -> str:
        target = m.group(2)
        path = _local(target)
        if path is None:
            return m.group(0)
        anchor = target[len(path) :]
        repo = posixpath.normpath(posixpath.join(base, path))
        if not (root / repo).exists():
            LOG.warning("%s links to %r: %s is not in the repository", repo_file, target, repo)
        site = posixpath.relpath(_site_path(repo), site_base or ".")
        return f"{m.group(1)}{site}{anchor}{m.group(3)}"

    return LINK.sub(one, markdown)


def gfm_lists(markdown: str) -> str:
    """Re-indent GitHub-style lists for Python-Markdown: a blank line before a list (and
    after a fenced block inside one), and four spaces per nesting level."""
    out: list[str] = []
    stack: list[tuple[int, int, int]] = []  # (marker indent, content indent, content for PM)
    fence_shift: int | None = None
    prev_blank = True
    for line in markdown.split("\n"):
        if fence_shift is not None:  # inside a fenced block: move it with its opening line
            out.append(_shift(line, fence_shift))
            if FENCE.match(line):
                fence_shift = None
                out.append("")
                prev_blank = True
            continue
        if not line.strip():
            out.append(line)
            prev_blank = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        item = ITEM.match(line)
        sibling = False
        if item or prev_blank:
            while stack and indent < stack[-1][1]:
                sibling = sibling or stack[-1][0] == indent
                stack.pop()
        if item:
            new_indent = stack[-1][2] if stack else indent
            if not prev_blank and not sibling:  # a list starts: Python-Markdown wants a gap
                out.append("")
            content = indent + len(item.group(2)) + len(item.group(3))
            stack.append((indent, content, new_indent + 4))
            new_line = " " * new_indent + line[indent:]
        elif stack and indent >= stack[-1][1]:
            new_line = " " * (stack[-1][2] + indent - stack[-1][1]) + line[indent:]
        else:
            new_line = line
        if FENCE.match(line):
            fence_shift = (len(new_line) - len(new_line.lstrip(" "))) - indent
            if not prev_blank and not item:
                out.append("")
        out.append(new_line)
        prev_blank = False
    return "\n".join(out)


def _shift(line: str, delta: int) -> str:
    if delta >= 0:
        return " " * delta + line
    drop = min(-delta, len(line) - len(line.lstrip(" ")))
    return line[drop:]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    repo_file = _repo_path(page.file.src_uri)
    return gfm_lists(_rewrite(markdown, repo_file, _root(config)))
