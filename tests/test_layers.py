"""Layering: core/ imports no Qt; the GUI-side packages import no torch at module level."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_core_imports_without_qt():
    code = (
        "import importlib, pkgutil, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'PyQt5', 'PyQt6', 'pyqtgraph', 'shiboken6', 'qtpy'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import core\n"
        "names = [m.name for m in pkgutil.walk_packages(core.__path__, 'core.') if not m.name.endswith('__main__')]\n"
        "for n in names:\n"
        "    importlib.import_module(n)\n"
        "print(len(names))\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 6


@pytest.mark.slow
def test_gui_side_modules_do_not_import_torch():
    code = (
        "import importlib, pkgutil, sys\n"
        "import app, widgets\n"
        "mods = []\n"
        "for pkg in (app, widgets):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        mods.append(m.name)\n"
        "for name in mods:\n"
        "    importlib.import_module(name)\n"
        "import core.model.trace, core.client.handle, app.cli.summary\n"
        "print('torch' in sys.modules, len(mods))\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    loaded, count = result.stdout.split()
    assert loaded == "False"
    assert int(count) >= 2
