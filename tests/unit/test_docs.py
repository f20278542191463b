"""The docs a user reads on GitHub: every relative link of the README, CONTRIBUTING,
CHANGELOG and the pages under docs/ points at a file that exists and, into Markdown, at a
heading that exists (anchors as GitHub makes them); the README stays a short tour and keeps
the two set-up commands exactly. `mkdocs build --strict` (.ci/run) checks the same links on
the site; this needs no build.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 300
SETUP_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 numpy -e . && "
    "sshddp doctor inventories/localhost.yaml && "
    "sshddp launch inventories/localhost.yaml examples/allreduce.py",
    "bash .ci/run",
)
FENCED = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1", re.S)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#* *$", re.M)


def pages() -> list[Path]:
    top = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    return top + sorted((ROOT / "docs").rglob("*.md"))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower-cased, without punctuation but
    `-` and `_`, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    kept = "".join(
        ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N", "M")
    )
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCED.sub("", path.read_text(encoding="utf-8"))):
        slug = github_slug(heading)
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return frozenset(found)


def relative_links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCED.sub("", path.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken(page: Path, target: str) -> str | None:
    """Why a link of the page does not resolve, or None."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: {dest.name} has no heading #{anchor}"
    return None


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_as_github_reads_it(page: Path) -> None:
    problems = [why for t in relative_links(page) if (why := broken(page, t))]
    assert problems == [], f"{page.relative_to(ROOT)}: " + "; ".join(problems)


def test_the_readme_is_a_short_tour_that_links_every_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README)}
    topics = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert sorted(map(str, topics - linked)) == []


@pytest.mark.parametrize("command", SETUP_COMMANDS)
def test_the_readme_keeps_the_set_up_commands_verbatim(command: str) -> None:
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    assert command in [line for block in blocks for line in block.splitlines()]


def test_the_link_check_sees_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Where is it stuck? `sshddp stacks`\n\n## Restarts: `--max-restarts N`\n\n"
        "[a](#where-is-it-stuck-sshddp-stacks) [b](#restarts---max-restarts-n) "
        "[c](#restarts-max-restarts-n) [d](missing.md) `[e](in-code.md)`\n"
    )
    found = relative_links(page)
    assert found == [
        "#where-is-it-stuck-sshddp-stacks",
        "#restarts---max-restarts-n",
        "#restarts-max-restarts-n",
        "missing.md",
    ]
    assert [t for t in found if broken(page, t)] == ["#restarts-max-restarts-n", "missing.md"]
