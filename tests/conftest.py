"""Shared test setup: Qt runs offscreen unless a test starts its own display."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXAMPLES = ROOT / "resources" / "examples"


@pytest.fixture
def window(request, qtbot, tmp_path, monkeypatch):
    """The main window, shown at 1200 x 800, with its settings in the test's own folder. A test
    module's ``WINDOW_TIMEOUT`` sets the run time limit (60 s when it has none)."""
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.window.window import MainWindow

    w = MainWindow(timeout=getattr(request.module, "WINDOW_TIMEOUT", 60))
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.handle.close()


@pytest.fixture
def view(request, qtbot):
    """A graph view, shown at 1000 x 700, or at a test module's ``VIEW_SIZE``."""
    from widgets.graph.view import GraphView

    v = GraphView()
    v.resize(*getattr(request.module, "VIEW_SIZE", (1000, 700)))
    qtbot.addWidget(v)
    v.show()
    qtbot.waitExposed(v)
    return v


@pytest.fixture
def sigint_gate():
    """A worker's Stop gate (``core.worker.interrupts.Interrupts``), installed as this process's
    SIGINT handler; the handler found before is put back afterwards."""
    import signal

    from core.worker.interrupts import Interrupts

    previous = signal.getsignal(signal.SIGINT)
    gate = Interrupts()
    gate.install()
    yield gate
    signal.signal(signal.SIGINT, previous)
