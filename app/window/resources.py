"""Icons and bundled examples, found through one helper (shipped as package data)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from PySide6.QtGui import QIcon

RESOURCES = Path(__file__).resolve().parents[2] / "resources"
ICONS = RESOURCES / "icons"
EXAMPLES = RESOURCES / "examples"
DEFAULT_EXAMPLE = EXAMPLES / "13_mlp_classifier.py"


@lru_cache(maxsize=None)
def icon(name: str) -> QIcon:
    path = ICONS / f"{name}.svg"
    return QIcon(str(path)) if path.is_file() else QIcon()


def example_title(path: Path) -> str:
    """The first comment line of an example is its title."""
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("#") and not line.startswith("#!"):
                    return line.lstrip("# ").rstrip(".")
                if line:
                    break
    except OSError:
        pass
    return path.stem


def example_scripts() -> list[tuple[Path, str]]:
    return [(p, example_title(p)) for p in sorted(EXAMPLES.glob("[0-9]*.py"))]
