"""Generated, committed files: write them, or list those that differ from what the code makes."""

from __future__ import annotations

from pathlib import Path


def write(outputs: dict[Path, str], check: bool = False) -> list[Path]:
    """Write every file whose content differs (with check, only list them). Returns the changed paths."""
    changed = []
    for path, content in outputs.items():
        if not path.exists() or path.read_text() != content:
            changed.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
    return changed
