"""A script's imports read on this machine (pure parsing, and the local files around it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sshddp.errors import ExitCode
from sshddp.model.imports import (
    ImportRef,
    compile_problem,
    imports_run,
    modules_wanted,
    provided_by,
    top_level_imports,
)
from sshddp.model.plan import CodeSpec
from sshddp.run.preflight import CodeDoesNotCompile, compile_code
from sshddp.run.scriptcheck import script_imports

SCRIPT = '''\
"""A training script."""
from __future__ import annotations
import os, sys
import torch.distributed as dist
from numpy.linalg import norm
from . import sibling
from .pkg import thing
try:
    import wandb
except ImportError:
    wandb = None
try:
    import yaml
except (KeyError, ModuleNotFoundError):
    pass
try:
    import tomllib
except KeyError:
    tomllib = None
finally:
    import atexit
with open(__file__) as fh:
    import json
if sys.platform == "win32":
    import winreg
if TYPE_CHECKING:
    import mypy_extensions


def main():
    import lazy_only


class Model:
    import in_class


if __name__ == "__main__":
    import helpers
    from models.resnet import ResNet
'''


def test_only_imports_that_always_run_count() -> None:
    assert top_level_imports(SCRIPT) == (
        "os",
        "sys",
        "torch",
        "numpy",
        "tomllib",
        "atexit",
        "json",
        "helpers",
        "models",
    )


def test_a_script_that_does_not_parse_raises() -> None:
    with pytest.raises(SyntaxError):
        top_level_imports("import os\ndef broken(:\n")


def test_a_shipped_tree_provides_what_is_beside_the_script() -> None:
    files = [
        "train.py",
        "helpers.py",
        "models/__init__.py",
        "models/resnet.py",
        "nsp/mod.py",  # a namespace package
        "ext.cpython-311-x86_64-linux-gnu.so",
        "README.md",
        "data-files/x.py",
        "sub/tool.py",
        "sub/local_mod.py",
    ]
    assert provided_by(files, "") == {"train", "helpers", "models", "nsp", "ext", "sub"}
    assert provided_by(files, "sub") == {"tool", "local_mod"}


def test_script_imports_of_a_single_file_names_the_modules_beside_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import json\nimport helpers\nimport pkg.sub\n")
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "pkg").mkdir()
    code = CodeSpec("file", "train.py", str(tmp_path / "train.py"))
    imp = script_imports(code, module=False)
    assert imp is not None
    assert imp.names == ("json", "helpers", "pkg")  # a single file ships nothing else
    assert imp.beside == ("helpers", "pkg") and imp.shipped == ()


def test_script_imports_in_a_workdir_leave_out_what_ships(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("import json\nimport helpers\nimport ignored\n")
    (tmp_path / "src" / "helpers.py").write_text("")
    (tmp_path / "src" / "ignored.py").write_text("")
    (tmp_path / ".gitignore").write_text("ignored.py\n")
    imp = script_imports(CodeSpec("tar", "src/train.py", str(tmp_path)), module=False)
    assert imp is not None
    assert imp.names == ("json", "ignored") and imp.shipped == ("helpers",)


def test_module_runs_check_the_module_itself(tmp_path: Path) -> None:
    imp = script_imports(CodeSpec("none", "mypkg.train"), module=True)
    assert imp is not None and imp.names == ("mypkg",)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "train.py").write_text("")
    shipped = script_imports(CodeSpec("tar", "mypkg.train", str(tmp_path)), module=True)
    assert shipped is not None and shipped.names == () and shipped.shipped == ("mypkg",)


def test_scripts_on_the_hosts_are_not_read_and_bad_ones_are_skipped(tmp_path: Path) -> None:
    assert script_imports(CodeSpec("remote", "~/train.py"), module=False) is None
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nif True\n")
    imp = script_imports(CodeSpec("file", "bad.py", str(bad)), module=False)
    assert imp is not None and imp.names == ()
    assert imp.error.startswith(f"{bad}:2: does not parse here")


def test_a_syntax_error_is_named_with_its_file_line_and_caret() -> None:
    problem = compile_problem(b"import os\n\ndef f(x):\n    return (x,\n", "t.py")
    assert problem is not None
    head, line, caret = problem.splitlines()
    assert head.startswith("t.py:4: SyntaxError: ") and "never closed" in head
    assert line == "    return (x,"
    assert caret == "           ^"  # under the '(' that is never closed
    assert compile_problem(b"import os\n", "t.py") is None


def test_what_only_the_compiler_refuses_counts_too() -> None:
    """``ast.parse`` accepts these; compiling them, as every rank does, fails."""
    for source in (b"return 1\n", b"break\n", b"def f():\n    x = 1\n    global x\n"):
        assert compile_problem(source, "t.py") is not None, source
    assert "null bytes" in (compile_problem(b"x = 1\0\n", "t.py") or "")


def test_relative_and_dotted_imports_name_every_module_they_load() -> None:
    refs = imports_run("import a.b.c\nfrom . import x, y\nfrom ..up import z\n")
    assert refs[0] == ImportRef("a.b.c")
    assert modules_wanted(refs[0], "", False) == ["a", "a.b", "a.b.c"]
    assert modules_wanted(refs[1], "pkg.mod", False) == ["pkg", "pkg.x", "pkg.y"]
    assert modules_wanted(refs[1], "pkg", True) == ["pkg", "pkg.x", "pkg.y"]
    assert modules_wanted(refs[2], "pkg.sub.mod", False) == ["pkg", "pkg.up", "pkg.up.z"]
    assert modules_wanted(refs[1], "", False) == []  # a script has no package
    assert modules_wanted(refs[2], "pkg.mod", False) == []  # beyond the top package


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_workdir_compiles_what_the_script_imports_from_it(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "train.py": "import json\nimport pkg.sub\n",
            "pkg/__init__.py": "",
            "pkg/sub.py": "from . import helper\n",
            "pkg/helper.py": "x = (\n",
            "unused.py": "this is not python\n",  # imported by nothing: not the launch's business
        },
    )
    with pytest.raises(CodeDoesNotCompile) as caught:
        compile_code(CodeSpec("tar", "train.py", str(tmp_path)), module=False)
    assert caught.value.exit_code == ExitCode.CHECK_FAILED
    assert caught.value.message.startswith(f"{tmp_path / 'pkg' / 'helper.py'}:1: SyntaxError")
    with pytest.raises(CodeDoesNotCompile):
        compile_code(CodeSpec("tar", "pkg.sub", str(tmp_path)), module=True)
    (tmp_path / "pkg" / "helper.py").write_text("x = 1\n")
    compile_code(CodeSpec("tar", "train.py", str(tmp_path)), module=False)


def test_a_module_a_function_imports_is_left_alone(tmp_path: Path) -> None:
    _tree(tmp_path, {"train.py": "def main():\n    import lazy\n", "lazy.py": "x = (\n"})
    compile_code(CodeSpec("tar", "train.py", str(tmp_path)), module=False)
    _tree(tmp_path, {"bad.py": "if True\n"})
    with pytest.raises(CodeDoesNotCompile, match="bad.py:1: SyntaxError"):
        compile_code(CodeSpec("file", "bad.py", str(tmp_path / "bad.py")), module=False)
