"""The import contracts in pyproject.toml hold, they fail when broken, and project modules form no circle.

``lint-imports`` checks the contracts statically (every import, at the top of a module or inside
a function); tests/test_layers.py imports the modules and checks what actually loads.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "app", "widgets")
FUNCTION_IMPORT_LIMIT = 10


def lint_imports(cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                            os.environ.get("PATH", "")]))
    assert exe, "lint-imports is not installed (pip install -e '.[test]')"
    return subprocess.run([exe, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def project_files(root: Path) -> list[Path]:
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    return files + [root / "backprop_studio.py"]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_project(name: str) -> bool:
    return name.split(".")[0] in PACKAGES or name == "backprop_studio"


def imported_modules(node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The project modules an import statement loads (``from core.model import trace`` names core.model.trace)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if is_project(a.name)]
    if node.level or not node.module or not is_project(node.module):
        return []
    subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
    return subs if len(subs) == len(node.names) else [node.module, *subs]


def function_imports(root: Path) -> list[tuple[str, int, str]]:
    """(file, line, source line) of each project import inside a function."""
    found = set()
    for path in project_files(root):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and imported_modules(node, set()):
                        found.add((str(path.relative_to(root)), node.lineno, lines[node.lineno - 1]))
    return sorted(found)


def test_lint_imports_passes_on_the_tree():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


def test_a_broken_contract_fails_lint_imports(tmp_path):
    """Qt imported by core and torch by widgets, in a copy of the tree: both contracts report it."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("backprop_studio.py", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for rel, line in (("core/model/trace.py", "import PySide6"), ("widgets/theme.py", "import torch")):
        path = tmp_path / rel
        path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))  # the copy, not the installed package
    result = lint_imports(tmp_path, env)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "core is Qt-free BROKEN" in out
    assert "the GUI never imports torch BROKEN" in out
    assert "core.model.trace -> PySide6" in out and "widgets.theme -> torch" in out
    assert "worker and client are independent KEPT" in out


def test_project_modules_import_no_circle():
    """Every import counts, at the top of a module or inside a function, as lint-imports sees them."""
    paths = {module_name(ROOT, p): p for p in project_files(ROOT)}
    graph = nx.DiGraph()
    graph.add_nodes_from(paths)
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported_modules(node, set(paths)):
                    if target in paths and target != name:
                        graph.add_edge(name, target)
    assert graph.number_of_edges() > 300  # the graph really was read
    circles = sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)
    assert circles == []


def test_few_project_imports_inside_functions_each_saying_why():
    found = function_imports(ROOT)
    assert len(found) <= FUNCTION_IMPORT_LIMIT, "\n".join(f"{f}:{n}: {line.strip()}" for f, n, line in found)
    assert [(f, n) for f, n, line in found if "#" not in line] == []
