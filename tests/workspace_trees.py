"""Code trees for the workspace tests, unit and integration."""

from __future__ import annotations

from pathlib import Path


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def code_dir(tmp_path: Path, files: dict[str, bytes], name: str = "code") -> Path:
    code = tmp_path / name
    for rel, data in files.items():
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_bytes(data)
    (code / ".sha256").write_text("digest\n")
    return code
