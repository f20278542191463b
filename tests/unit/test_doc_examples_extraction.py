"""The docs' shell examples as tests/doc_examples.py extracts them: every block that uses
sshddp is either run by tests/integration/test_docs_examples.py or marked with its reason."""

from __future__ import annotations

from pathlib import Path

from doc_examples import ROOT, all_examples, parse

DOC = Path(ROOT / "docs" / "page.md")
TEXT = """\
Intro.

```bash
sshddp launch inv.yaml train.py --epochs 3   # the script's own options
# a comment line
sshddp launch --launcher node --workdir . inv.yaml -- accelerate launch \\
  --num_machines {nnodes} train.py
```

<!-- not run: needs GPUs -->

```bash
sshddp exec inv.yaml -- nvidia-smi
```

```console
$ sshddp ps
RUN      STATE
k3f9xq   running
```

```bash
pip install -e '.[docs]'
```

```yaml
hosts: [sshddp launch]
```
"""


def test_blocks_that_use_sshddp_are_examples_with_their_line_and_marker() -> None:
    found = parse(DOC, TEXT)
    assert [(e.line, e.not_run) for e in found] == [(3, None), (12, "needs GPUs"), (16, None)]


def test_commands_join_continuations_and_drop_comments_and_console_output() -> None:
    first, _, console = parse(DOC, TEXT)
    assert first.commands() == [
        "sshddp launch inv.yaml train.py --epochs 3   # the script's own options",
        "sshddp launch --launcher node --workdir . inv.yaml -- accelerate launch "
        "   --num_machines {nnodes} train.py",
    ]
    assert console.commands() == ["sshddp ps"]


def test_a_marker_must_be_on_the_line_before_the_fence() -> None:
    text = "<!-- not run: too far -->\n\nSome prose.\n\n```bash\nsshddp ps\n```\n"
    assert [e.not_run for e in parse(DOC, text)] == [None]


def test_every_example_of_the_docs_runs_or_says_why_not() -> None:
    examples = all_examples()
    assert any(e.path.name == "README.md" for e in examples)
    for example in examples:
        assert example.commands(), f"{example.name}: an example with no command"
        if example.language == "python":
            compile(example.text, example.name, "exec")  # a script, run whole
        elif example.not_run is None:
            assert all(c.startswith("sshddp ") for c in example.commands()), (
                f"{example.name}: a command that is not sshddp's; mark the block "
                "`<!-- not run: why -->` or make it one sshddp command a line"
            )
        else:
            assert example.not_run.strip(), f"{example.name}: a `not run` marker says why"


def test_python_blocks_of_the_docs_that_call_the_api_are_examples() -> None:
    text = "```python\nimport sshddp\nsshddp.launch(f, 'inv.yaml')\n```\n\n```python\nx = 1\n```\n"
    found = parse(DOC, text)
    assert [(e.line, e.language, e.not_run) for e in found] == [(1, "python", None)]
    assert parse(ROOT / "README.md", text) == []  # the README's lines are a fragment
    assert any(e.language == "python" for e in all_examples())
