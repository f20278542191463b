"""The shell examples of README.md and docs/*.md that use sshddp, as the docs' test runs them.

An example is a fenced ``bash`` / ``console`` / ``sh`` block with an ``sshddp`` command in it.
One that cannot run on the test hosts (GPUs, a real Slurm allocation, a package install) is
marked in the doc by a comment on the line before its fence, which the site does not show::

    <!-- not run: needs GPUs (nvidia-smi) -->
    ```bash
    sshddp exec inv.yaml -- nvidia-smi
    ```

Every other example is run, one command at a time, by
tests/integration/test_docs_examples.py; tests/unit/test_doc_examples_extraction.py checks
that each example is one or the other.

A fenced ``python`` block of a page under docs/ that calls ``sshddp.launch`` or
``sshddp.start`` is an example too (``language`` "python"): run whole, as a script. The
README's Python lines are a fragment of its tour (the README is the lead's), not an example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = {"bash", "console", "sh", "shell"}
PYTHON = {"python", "py"}
USES_API = re.compile(r"\bsshddp\.(?:launch|start)\(")
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->\s*$")
USES_SSHDDP = re.compile(r"(?:^|[\s;&|(])sshddp\s")
PROMPT = "$ "


# README.md is edited by the lead only (CONTRIBUTING): its examples that cannot run here,
# by their first line, until the README carries the `<!-- not run: ... -->` markers itself.
@dataclass(frozen=True)
class Example:
    """One fenced shell block that uses sshddp."""

    path: Path
    line: int  #: 1-based line of the opening fence
    text: str
    not_run: str | None  #: why it cannot run on the test hosts; None: it runs
    language: str = "shell"  #: "shell" (one command at a time) or "python" (a script)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        """Its commands: continuation lines joined, a ``$`` prompt, comments and output
        lines of a console block left out."""
        lines = self.text.splitlines()
        if any(line.startswith(PROMPT) for line in lines):
            lines = [line[len(PROMPT) :] for line in lines if line.startswith(PROMPT)]
        joined = "\n".join(lines).replace("\\\n", " ")
        stripped = (line.strip() for line in joined.splitlines())
        return [line for line in stripped if line and not line.startswith("#")]


def parse(path: Path, text: str) -> list[Example]:
    """The examples of one Markdown file's text."""
    found: list[Example] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        body = "\n".join(lines[i + 1 : end])
        if fence.group(1) in LANGUAGES and USES_SSHDDP.search(body):
            found.append(Example(path, i + 1, body, _not_run(path, lines[:i], body)))
        elif fence.group(1) in PYTHON and USES_API.search(body) and path.name != "README.md":
            found.append(Example(path, i + 1, body, _not_run(path, lines[:i], body), "python"))
        i = end + 1
    return found


def _not_run(path: Path, before: list[str], body: str) -> str | None:
    """The reason of the marker on the nearest non-blank line before the fence, if any."""
    previous = next((line for line in reversed(before) if line.strip()), "")
    marker = NOT_RUN.match(previous.strip())
    if marker:
        return marker.group(1)
    return None


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_examples() -> list[Example]:
    return [ex for path in doc_files() for ex in parse(path, path.read_text(encoding="utf-8"))]
