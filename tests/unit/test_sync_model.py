"""Pure parts of ``sshddp sync``: the project's Python request, its digest, outcomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sshddp.errors import ExitCode, InventoryError, UsageError
from sshddp.model import sync as model
from sshddp.model.inventory import parse_inventory
from sshddp.model.sync import HostSync, SyncStatus
from sshddp.run.sync import project_path

PYPROJECT = '[project]\nname = "x"\nrequires-python = ">=3.10"\n\n[tool.uv]\npackage = false\n'


def test_python_version_file_wins_over_requires_python() -> None:
    files = {"pyproject.toml": PYPROJECT, ".python-version": "# pinned\n3.11\n"}
    assert model.python_request(files) == "3.11"
    assert model.python_request({"pyproject.toml": PYPROJECT}) == ">=3.10"


def test_requires_python_outside_the_project_table_is_not_read() -> None:
    text = '[project]\nname = "x"\n\n[tool.other]\nrequires-python = ">=3.12"\n'
    assert model.python_request({"pyproject.toml": text}) == ""


def test_a_project_without_a_lock_names_what_is_missing() -> None:
    with pytest.raises(UsageError, match="no uv.lock there.*uv lock"):
        model.project("/p", {"pyproject.toml": PYPROJECT}, "0.13.9")


def test_the_digest_follows_the_lock_and_the_uv_version() -> None:
    files = {"pyproject.toml": PYPROJECT, "uv.lock": "version = 1\n"}
    one = model.project("/p", files, "0.13.9").digest
    assert model.project("/q", files, "0.13.9").digest == one  # where it is does not count
    assert model.project("/p", {**files, "uv.lock": "version = 2\n"}, "0.13.9").digest != one
    assert model.project("/p", files, "0.14.0").digest != one


def test_exit_code_says_unreachable_then_sync_failed() -> None:
    ok = HostSync(0, "a", SyncStatus.READY, key="k")
    failed = HostSync(1, "b", SyncStatus.FAILED, error="boom")
    down = HostSync(2, "c", SyncStatus.UNREACHABLE)
    assert model.exit_code([ok]) is ExitCode.OK
    assert model.exit_code([ok, failed]) is ExitCode.SYNC_FAILED
    assert model.exit_code([ok, failed, down]) is ExitCode.UNREACHABLE
    assert model.pythons([ok, failed]) is None
    assert "failed on 1 of 2 host(s): b (failed)" in model.summary([ok, failed])


def test_an_unknown_answer_is_a_failure() -> None:
    result = model.outcome(0, "a", {"status": "weird", "error": "x"}, 0.1)
    assert result.status is SyncStatus.FAILED and result.error == "x"


def test_inventory_sync_key_is_read_from_defaults_and_found_beside_the_file(
    tmp_path: Path,
) -> None:
    inv_file = tmp_path / "inv.yaml"
    text = "defaults:\n  sync: proj\nhosts:\n  - host: a\n"
    inventory = parse_inventory(text, str(inv_file))
    assert inventory.sync == "proj"
    inv_file.write_text(text)
    assert project_path(None, inventory) == str(tmp_path / "proj")
    assert project_path("other", inventory) == "other"  # --sync wins, from the cwd
    assert project_path(None, parse_inventory("hosts:\n  - host: a\n")) is None


def test_inventory_sync_key_is_not_a_hosts() -> None:
    with pytest.raises(InventoryError, match="sync"):
        parse_inventory("hosts:\n  - host: a\n    sync: proj\n")


def test_a_hosts_words_cannot_drive_the_terminal() -> None:
    result = HostSync(0, "a", SyncStatus.FAILED, error="error: x\x1b]52;c;cHduZWQ=\x07\nnext")
    shown = model.line(result, "")
    assert "\x1b" not in shown and "\x07" not in shown and "\nnext" in shown


def test_a_pylock_is_a_project_asking_for_its_requires_python() -> None:
    lock = 'lock-version = "1.0"\nrequires-python = ">=3.11"\n\n[[packages]]\nname = "six"\n'
    project = model.project("x", {model.PYLOCK: lock}, "0.1")
    assert project.python == ">=3.11"
    assert model.project("x", {model.PYLOCK: lock + "\n"}, "0.1").digest != project.digest
    assert model.is_pylock("pylock.toml") and model.is_pylock("pylock.gpu.toml")
    assert not model.is_pylock("pyproject.toml") and not model.is_pylock("pylock.a.b.toml")


LOCAL_LOCK = """version = 1
requires-python = ">=3.9"

[[package]]
name = "lib2"
version = "0.1.0"
source = { editable = "../lib2" }

[[package]]
name = "mylib"
version = "0.1.0"
source = { directory = "/abs/mylib" }

[[package]]
name = "numpy"
version = "2.2.6"
source = { registry = "file:///opt/pypi/simple" }

[[package]]
name = "proj"
version = "0"
source = { virtual = "." }
"""


def test_a_lock_that_builds_a_library_from_a_local_path_is_refused_naming_it() -> None:
    """Each host would build it from its own copy, which the key does not follow."""
    with pytest.raises(UsageError) as caught:
        model.project("proj", {"pyproject.toml": "", "uv.lock": LOCAL_LOCK}, "0.9")
    said = str(caught.value)
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    assert "lib2 (editable ../lib2), mylib (directory /abs/mylib) from a local path" in said
    assert "numpy" not in said and "proj" not in said.split(":", 1)[1]
    pins = "numpy==2.2.6\n-e ../mylib\nother @ file:///abs/other\n--index-url http://i/simple\n"
    assert model.local_sources({model.PINNED: pins}) == [
        "a package (../mylib)",
        "a package (file:///abs/other)",
    ]
    pylock = '[[packages]]\nname = "a"\ndirectory = { path = "../a", editable = true }\n'
    assert model.local_sources({model.PYLOCK: pylock}) == ["a package (path ../a)"]
    itself = '[[package]]\nname = "proj"\nversion = "0"\nsource = { editable = "." }\n'
    assert model.local_sources({"uv.lock": itself}) == []  # the project is not installed
